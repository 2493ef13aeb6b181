-- fixed_window.lua: one decision of a fixed window counter, windows aligned to multiples of the
-- period since the Unix epoch; fixedWindow in limit/algorithms.go is the same computation.
-- Clock: the server's TIME unless ARGV[1] is an instant.
--
-- KEYS[1]  the window: varints start, count (see lib.lua), start in µs since the Unix epoch;
--          it expires when the window ends.
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per window
-- ARGV[4]  cost in requests
-- Returns  {allowed (1 or 0), remaining, reset_after µs, retry_after µs, the instant decided at µs}
local now = clock(ARGV[1])
local period, limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local start, count = 0, 0
local s = get_state(KEYS[1], 2)
if s then
  start, count = s[1], s[2]
  now = math.max(now, start) -- the key's clock never runs backwards
end
local w = fdiv(now, period) * period
if w ~= start then
  start, count = w, carry(count, window_rolls(start, w, period), limit)
end

local left = start + period - now
local allowed, retry = 0, 0
if count + cost <= limit then
  allowed = 1
  count = count + cost
else
  retry = windows_wait(count, limit - cost, limit, period, left)
end
local reset = math.max(left, windows_wait(count, 0, limit, period, left))
set_state(KEYS[1], reset, start, count)
return {allowed, math.max(0, limit - count), reset, retry, now}
