-- sliding_window_adjust.lua: one adjustment of a sliding window counter (Limiter.Adjust);
-- slidingWindowAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME
-- unless ARGV[1] is an instant.
--
-- KEYS[1]  both counters, as in sliding_window.lua
-- KEYS[2]  the charges made (charge_once in lib.lua): the state's key + ':c'
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per trailing period
-- ARGV[4]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[5]  delta: requests to count in the current window (> 0, up to limit + debt: above
--          limit is debt, counted by the windows after) or to uncount (< 0) from the window
--          of at, if that is the current or the previous one, never below 0
-- ARGV[6]  debt: the most the key may owe beyond limit
-- ARGV[7]  the charge's ID (limit.Decision.ChargeID), '0' for none
-- Returns  1 when the counters were written, 2 when they were and the charge was capped at
--          the debt, 0 when there was nothing to refund to;
--          3 when the charge of ARGV[7] was made already: nothing was changed
local now = clock(ARGV[1])
local period, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local at, delta, maxdebt = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if delta > 0 and not charge_once(KEYS[2], ARGV[7], now) then
  return 3
end

local start, prev, cur = 0, 0, 0
local s = get_state(KEYS[1], 3)
if s then
  start, prev, cur = s[1], s[2], s[3]
  now = math.max(now, start)
end
local w = fdiv(now, period) * period
prev, cur = slide_roll(prev, cur, start, w, period, limit)
start = w

local aw = fdiv(at, period) * period
local capped = 1
if delta > 0 then
  local room = math.max(0, limit + maxdebt - cur)
  if delta > room then
    capped = 2
  end
  cur = cur + math.min(delta, room)
elseif aw == w then
  cur = cur - math.min(-delta, cur)
elseif aw == w - period then
  prev = prev - math.min(-delta, prev)
else
  return 0 -- the charge no longer weighs in the estimate
end

local reset = slide_wait(prev, cur, period, start + period - now, 0, limit)
set_state(KEYS[1], reset, start, prev, cur)
return capped
