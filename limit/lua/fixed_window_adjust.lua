-- fixed_window_adjust.lua: one adjustment of a fixed window counter (Limiter.Adjust);
-- fixedWindowAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME
-- unless ARGV[1] is an instant.
--
-- KEYS[1]  the window, as in fixed_window.lua
-- KEYS[2]  the charges made (charge_once in lib.lua): the state's key + ':c'
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per window
-- ARGV[4]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[5]  delta: requests to count in the current window (> 0, up to limit + debt: above
--          limit is debt, counted by the windows after) or to uncount (< 0) if at is in the
--          current window, never below 0
-- ARGV[6]  debt: the most the key may owe beyond limit
-- ARGV[7]  the charge's ID (limit.Decision.ChargeID), '0' for none
-- Returns  1 when the window was written, 2 when it was and the charge was capped at the
--          debt, 0 when there was nothing to refund to;
--          3 when the charge of ARGV[7] was made already: nothing was changed
local now = clock(ARGV[1])
local period, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local at, delta, maxdebt = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if delta > 0 and not charge_once(KEYS[2], ARGV[7], now) then
  return 3
end

local start, count = 0, 0
local s = get_state(KEYS[1], 2)
if s then
  start, count = s[1], s[2]
  now = math.max(now, start)
end
local w = fdiv(now, period) * period
local capped = 1
if delta > 0 then
  if w ~= start then
    start, count = w, carry(count, window_rolls(start, w, period), limit)
  end
  local room = math.max(0, limit + maxdebt - count)
  if delta > room then
    capped = 2
  end
  count = count + math.min(delta, room)
elseif start == w and fdiv(at, period) * period == w then
  count = count - math.min(-delta, count)
else
  return 0 -- the charge's window has ended
end
local left = start + period - now
set_state(KEYS[1], math.max(left, windows_wait(count, 0, limit, period, left)), start, count)
return capped
