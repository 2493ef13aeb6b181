-- gcra.lua: one decision of the generic cell rate algorithm; gcra in limit/algorithms.go is the
-- same computation. Clock: the server's TIME unless ARGV[1] is an instant.
--
-- KEYS[1]  the theoretical arrival time: varints tat, frac (see lib.lua), the instant
--          tat + frac/refill µs since the Unix epoch; it expires when that instant has passed.
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  unit: one emission interval (period / limit) in 1/refill µs
-- ARGV[3]  refill: limit / gcd(limit, period µs), the number of those units per µs
-- ARGV[4]  cap: capacity × unit, the tolerance plus one emission interval
-- ARGV[5]  cost in requests
-- Returns  {allowed (1 or 0), remaining, reset_after µs, retry_after µs, the instant decided at µs}
local now = clock(ARGV[1])
local unit, refill, cap, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local tat, frac = now, 0
local s = get_state(KEYS[1], 2)
if s and s[1] >= now then
  tat, frac = s[1], s[2]
end
if frac >= refill then
  frac = refill - 1 -- the limit changed since the state was stored
end

local debt = (tat - now) * refill + frac -- tat - now, in 1/refill µs
local need = cost * unit
local allowed, retry, remaining = 0, 0, 0
if debt <= cap - need then
  allowed = 1
  debt = debt + need
  local whole = fdiv(debt, refill)
  tat, frac = now + whole, debt - whole * refill
else
  retry = cdiv(debt - (cap - need), refill)
end
if debt < cap then
  remaining = fdiv(cap - debt, unit)
end
local reset = cdiv(debt, refill)
set_state(KEYS[1], reset, tat, frac)
return {allowed, remaining, reset, retry, now}
