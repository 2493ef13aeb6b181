-- token_bucket.lua: one decision of a token bucket; tokenBucket in limit/algorithms.go is the
-- same computation. Clock: the server's TIME unless ARGV[1] is an instant.
--
-- KEYS[1]  the bucket: varints tokens, last, unit (see lib.lua), tokens scaled so that one
--          token is unit, last in µs since the Unix epoch; it expires when the bucket would be
--          full again. A fourth number, when present, is debt: tokens below 0; the numbers
--          after it are the record of levels that makes refunds exact (see store_peaks in
--          peaks.lua).
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  unit: scaled units per token (period µs / gcd(limit, period µs))
-- ARGV[3]  refill: scaled units added per µs (limit / gcd(limit, period µs))
-- ARGV[4]  cap: the bucket's capacity × unit
-- ARGV[5]  cost in tokens
-- ARGV[6]  1: note the level before a charge in the record (Limit.Refunds); else the record is
--          emptied at each charge, and refunds take the rule without one
-- Returns  {allowed (1 or 0), remaining, reset_after µs, retry_after µs, the instant decided at µs}
local now = clock(ARGV[1])
local unit, refill, cap, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local tokens, last = cap, now
local since, list = now - 1, {}
local s = get_state(KEYS[1], 3, 5 + 2 * MAX_PEAKS)
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
  now = last -- the key's clock never runs backwards
end
if now - last >= cdiv(cap - tokens, refill) then
  tokens = cap
else
  tokens = tokens + (now - last) * refill
end

local need = cost * unit
local allowed, retry = 0, 0
if tokens >= need then
  allowed = 1
  if ARGV[6] == '1' then
    since = peaks_note(list, since, now, tokens)
  else
    since, list = now, {} -- a charge not noted: the record knows nothing before it
  end
  tokens = tokens - need
else
  retry = cdiv(need - tokens, refill)
end
local reset = cdiv(cap - tokens, refill)
store_peaks(KEYS[1], reset, tokens, now, unit, since, list)
return {allowed, fdiv(math.max(tokens, 0), unit), reset, retry, now}
