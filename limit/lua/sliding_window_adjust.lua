-- sliding_window_adjust.lua: one adjustment of a sliding window counter (Limiter.Adjust);
-- slidingWindowAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME
-- unless ARGV[1] is an instant.
--
-- KEYS[1]  both counters, as in sliding_window.lua
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per trailing period
-- ARGV[4]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[5]  delta: requests to count in the current window (> 0, up to limit) or to uncount
--          (< 0) from the window of at, if that is the current or the previous one, never
--          below 0
-- Returns  1 when the counters were written, 0 when there was nothing to refund to
local now = clock(ARGV[1])
local period, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local at, delta = tonumber(ARGV[4]), tonumber(ARGV[5])

local start, prev, cur = 0, 0, 0
local s = get_state(KEYS[1], 3)
if s then
  start, prev, cur = s[1], s[2], s[3]
  now = math.max(now, start)
end
local w = fdiv(now, period) * period
if start == w - period then
  prev, cur = cur, 0
elseif start ~= w then
  prev, cur = 0, 0
end
start = w
prev, cur = math.min(prev, limit), math.min(cur, limit)

local aw = fdiv(at, period) * period
if delta > 0 then
  cur = cur + math.min(delta, limit - cur)
elseif aw == w then
  cur = cur - math.min(-delta, cur)
elseif aw == w - period then
  prev = prev - math.min(-delta, prev)
else
  return 0 -- the charge no longer weighs in the estimate
end

-- The µs until the estimate is 0 (wait(left, 0) in sliding_window.lua).
local left = start + period - now
local reset
if cur <= 0 then
  reset = 0
  if prev > 0 then
    reset = math.max(0, left - (cdiv(period, prev) - 1))
  end
else
  reset = left + math.max(0, period - (cdiv(period, cur) - 1))
end
set_state(KEYS[1], reset, start, prev, cur)
return 1
