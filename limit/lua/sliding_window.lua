-- sliding_window.lua: one decision of a sliding window counter (Cloudflare's); slidingWindow
-- in limit/algorithms.go is the same computation. Clock: the server's TIME unless ARGV[1] is an
-- instant.
--
-- KEYS[1]  both counters: varints start, prev, cur (see lib.lua), start = when the current
--          window started, µs since the Unix epoch; it expires when the estimate has fallen
--          to 0.
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per trailing period
-- ARGV[4]  cost in requests
-- Returns  {allowed (1 or 0), remaining, reset_after µs, retry_after µs, the instant decided at µs}
local now = clock(ARGV[1])
local period, limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local start, prev, cur = 0, 0, 0
local s = get_state(KEYS[1], 3)
if s then
  start, prev, cur = s[1], s[2], s[3]
  now = math.max(now, start) -- the key's clock never runs backwards
end
local w = fdiv(now, period) * period
prev, cur = slide_roll(prev, cur, start, w, period, limit)
start = w

local left = start + period - now
local estimate = fdiv(prev * left, period) + cur
local allowed, retry = 0, 0
if estimate + cost <= limit then
  allowed = 1
  cur = cur + cost
  estimate = estimate + cost
else
  retry = slide_wait(prev, cur, period, left, limit - cost, limit)
end
local reset = slide_wait(prev, cur, period, left, 0, limit)
set_state(KEYS[1], reset, start, prev, cur)
return {allowed, math.max(0, limit - estimate), reset, retry, now}
