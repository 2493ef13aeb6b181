-- gcra_adjust.lua: one adjustment of the generic cell rate algorithm (Limiter.Adjust);
-- gcraAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME unless
-- ARGV[1] is an instant.
--
-- KEYS[1]  the theoretical arrival time, as in gcra.lua
-- KEYS[2]  the charges made (charge_once in lib.lua): the state's key + ':c'
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  unit, ARGV[3] refill, ARGV[4] cap: as in gcra.lua
-- ARGV[5]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[6]  charged: the cost it charged, in requests
-- ARGV[7]  delta: emission intervals to move the TAT on (> 0, to cap + debt ahead of now at
--          most) or back (< 0, at most what has not been repaid since at, never before now)
-- ARGV[8]  debt: the most the key may owe beyond its capacity, scaled as cap
-- ARGV[9]  the charge's ID (limit.Decision.ChargeID), '0' for none
-- Returns  1 when the TAT was written, 2 when it was and the charge was capped at the debt,
--          0 when there was nothing to refund to
--          3 when the charge of ARGV[9] was made already: nothing was changed
local now = clock(ARGV[1])
local unit, refill, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local at, charged, delta = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if delta > 0 and not charge_once(KEYS[2], ARGV[9], now) then
  return 3
end
local maxdebt = tonumber(ARGV[8])
local capped = 1

local tat, frac = now, 0
local s = get_state(KEYS[1], 2)
if s and s[1] >= now then
  tat, frac = s[1], math.min(s[2], refill - 1)
elseif delta < 0 then
  return 0 -- no debt: nothing of this charge to refund
end

local debt = (tat - now) * refill + frac
if delta > 0 then
  local room = math.max(0, cap + maxdebt - debt)
  if delta * unit > room then
    capped = 2
  end
  debt = debt + math.min(delta * unit, room)
else
  debt = debt - math.min(-delta * unit, debt, unrepaid(unit, refill, at, charged, now))
end
local whole = fdiv(debt, refill)
set_state(KEYS[1], cdiv(debt, refill), now + whole, debt - whole * refill)
return capped
