-- sliding_log_adjust.lua: one adjustment of a sliding window log (Limiter.Adjust);
-- slidingLogAdjust in limit/algorithms.go is the same computation. Clock: the server's TIME
-- unless ARGV[1] is an instant.
--
-- KEYS[1]  the log, as in sliding_log.lua
-- KEYS[2]  the charges made (charge_once in lib.lua): the state's key + ':c'
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per trailing period
-- ARGV[4]  at: the instant of the charge, µs since the Unix epoch
-- ARGV[5]  delta: entries to log at now (> 0, as many as fit under limit) or to remove of
--          instant at (< 0), if they are still in the window
-- ARGV[6]  debt: unused (a log carries none)
-- ARGV[7]  the charge's ID (limit.Decision.ChargeID), '0' for none
-- Returns  1, or 2 when some of delta did not fit under limit (a log carries no debt);
--          3 when the charge of ARGV[7] was made already: nothing was changed
local now = clock(ARGV[1])
local period, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local at, delta = tonumber(ARGV[4]), tonumber(ARGV[5])
if delta > 0 and not charge_once(KEYS[2], ARGV[7], now) then
  return 3
end
local key = KEYS[1]
local capped = 1

local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[2] then
  now = math.max(now, tonumber(newest[2]))
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - period))

if delta > 0 then
  local n = redis.call('ZCARD', key)
  local add = math.min(delta, limit - n)
  if delta > add then
    capped = 2
  end
  local stamp = string.format('%.0f', now)
  local k = redis.call('ZCOUNT', key, stamp, stamp)
  local args = {}
  for i = 0, add - 1 do
    args[#args + 1] = stamp
    args[#args + 1] = stamp .. ':' .. (k + i)
    if #args >= 1000 or i == add - 1 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
elseif at > now - period then
  -- The members of one instant are numbered 0..k-1 (sliding_log.lua): remove the highest
  -- numbers, so that the next ones are numbered on from those left.
  local stamp = string.format('%.0f', at)
  local k = redis.call('ZCOUNT', key, stamp, stamp)
  local args = {}
  for i = math.max(0, k + delta), k - 1 do
    args[#args + 1] = stamp .. ':' .. i
    if #args >= 1000 or i == k - 1 then
      redis.call('ZREM', key, unpack(args))
      args = {}
    end
  end
end

local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', key, ttl_ms(tonumber(last[2]) + period - now))
end
return capped
