-- token_bucket_adjust.lua: one adjustment of a token bucket (Limiter.Adjust);
-- tokenBucketAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME
-- unless ARGV[1] is an instant.
--
-- KEYS[1]  the bucket, as in token_bucket.lua
-- KEYS[2]  the charges made (charge_once in lib.lua): the state's key + ':c'
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  unit, ARGV[3] refill, ARGV[4] cap: as in token_bucket.lua
-- ARGV[5]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[6]  charged: the cost it charged, in tokens
-- ARGV[7]  delta: tokens to charge (> 0, down to -debt at most) or refund (< 0, at most the
--          capacity less the highest level since at, from the bucket's record of levels; when
--          the record does not reach back to at, at most what has not refilled since at, and
--          never beyond a full bucket)
-- ARGV[8]  debt: the most the key may owe beyond its capacity, scaled as cap
-- ARGV[9]  the charge's ID (limit.Decision.ChargeID), '0' for none
-- Returns  1 when the bucket was written, 2 when it was and the charge was capped at the debt,
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

local tokens, last = cap, now
local since, list = now - 1, {}
local s = get_state(KEYS[1], 3, 5 + 2 * MAX_PEAKS)
if delta < 0 and (not s or s[3] ~= unit) then
  return 0 -- no state, or one kept under another limit: nothing of this charge to refund
end
if s then
  tokens, last = s[1] - (s[4] or 0), s[2]
  since, list = peaks_read(s, last)
  if s[3] ~= unit then
    tokens = rescale(tokens, s[3], unit)
    since, list = now, {}
  end
  tokens = math.min(tokens, cap)
end
if now < last then
  now = last
end
if now - last >= cdiv(cap - tokens, refill) then
  tokens = cap
else
  tokens = tokens + (now - last) * refill
end

if delta > 0 then
  local room = math.max(0, tokens + maxdebt)
  if delta * unit > room then
    capped = 2
  end
  since = peaks_note(list, since, now, tokens)
  tokens = tokens - math.min(delta * unit, room)
else
  local most = unrepaid(unit, refill, at, charged, now) -- what was always safe to give back
  local m = peaks_highest(list, since, at, charged * unit, tokens)
  if m then
    most = math.max(most, cap - m)
  end
  local give = math.max(0, math.min(-delta * unit, charged * unit, cap - tokens, most))
  tokens = tokens + give
  list = peaks_lift(list, at, give, cap, now)
end
store_peaks(KEYS[1], cdiv(cap - tokens, refill), tokens, now, unit, since, list)
return capped
