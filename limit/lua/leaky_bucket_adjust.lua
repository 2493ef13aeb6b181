-- leaky_bucket_adjust.lua: one adjustment of a leaky bucket used as a meter (Limiter.Adjust);
-- leakyBucketAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME
-- unless ARGV[1] is an instant.
--
-- KEYS[1]  the bucket, as in leaky_bucket.lua
-- KEYS[2]  the charges made (charge_once in lib.lua): the state's key + ':c'
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  unit, ARGV[3] refill, ARGV[4] cap: as in leaky_bucket.lua
-- ARGV[5]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[6]  charged: the cost it charged, in requests
-- ARGV[7]  delta: requests to pour in (> 0, up to cap + debt at most) or take out (< 0, at most
--          what has not leaked since at, and never below empty)
-- ARGV[8]  debt: the most the key may owe beyond its capacity, scaled as cap
-- ARGV[9]  the charge's ID (limit.Decision.ChargeID), '0' for none
-- Returns  1 when the bucket was written, 2 when it was and the charge was capped at the debt,
--          0 when there was nothing to refund to;
--          3 when the charge of ARGV[9] was made already: nothing was changed
local now = clock(ARGV[1])
local unit, refill, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local at, charged, delta = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if delta > 0 and not charge_once(KEYS[2], ARGV[9], now) then
  return 3
end
local maxdebt = tonumber(ARGV[8])
local capped = 1

local level, last = 0, now
local s = get_state(KEYS[1], 3)
if delta < 0 and (not s or s[3] ~= unit) then
  return 0 -- no state, or one kept under another limit: nothing of this charge to refund
end
if s then
  level, last = s[1], s[2]
  if s[3] ~= unit then
    level = rescale(level, s[3], unit)
  end
end
if now < last then
  now = last
end
if now - last >= cdiv(level, refill) then
  level = 0
else
  level = level - (now - last) * refill
end

if delta > 0 then
  local room = math.max(0, cap + maxdebt - level)
  if delta * unit > room then
    capped = 2
  end
  level = level + math.min(delta * unit, room)
else
  level = level - math.min(-delta * unit, level, unrepaid(unit, refill, at, charged, now))
end
set_state(KEYS[1], cdiv(level, refill), level, now, unit)
return capped
