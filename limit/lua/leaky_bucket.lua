-- leaky_bucket.lua: one decision of a leaky bucket used as a meter (nginx limit_req);
-- leakyBucket in limit/algorithms.go is the same computation. Clock: the server's TIME unless
-- ARGV[1] is an instant.
--
-- KEYS[1]  the bucket: varints level, last, unit (see lib.lua), level scaled so that one
--          request is unit, last in µs since the Unix epoch; it expires when the bucket would
--          be empty.
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  unit: scaled units per request (period µs / gcd(limit, period µs))
-- ARGV[3]  refill: scaled units that leak out per µs (limit / gcd(limit, period µs))
-- ARGV[4]  cap: the bucket's capacity × unit
-- ARGV[5]  cost in requests
-- Returns  {allowed (1 or 0), remaining, reset_after µs, retry_after µs, the instant decided at µs}
local now = clock(ARGV[1])
local unit, refill, cap, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local level, last = 0, now
local s = get_state(KEYS[1], 3)
if s then
  level, last = s[1], s[2]
  if s[3] ~= unit then
    level = rescale(level, s[3], unit)
  end
end
if now < last then
  now = last -- the key's clock never runs backwards
end
if now - last >= cdiv(level, refill) then
  level = 0
else
  level = level - (now - last) * refill
end

local need = cost * unit
local allowed, retry, remaining = 0, 0, 0
if level <= cap - need then
  allowed = 1
  level = level + need
else
  retry = cdiv(level - (cap - need), refill)
end
if level < cap then
  remaining = fdiv(cap - level, unit)
end
local reset = cdiv(level, refill)
set_state(KEYS[1], reset, level, now, unit)
return {allowed, remaining, reset, retry, now}
