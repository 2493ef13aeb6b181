-- sliding_log.lua: one decision of a sliding window log; slidingLog in limit/algorithms.go is
-- the same computation. Only admitted requests are logged. Clock: the server's TIME unless
-- ARGV[1] is an instant.
--
-- KEYS[1]  the log: a sorted set of admitted requests, score = time in µs since the Unix
--          epoch, member = "time:i" where i counts the members of that time; it expires when
--          its newest member leaves the window.
-- ARGV[1]  now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  period in µs
-- ARGV[3]  limit: requests per trailing period
-- ARGV[4]  cost in requests
-- Returns  {allowed (1 or 0), remaining, reset_after µs, retry_after µs, the instant decided at µs}
local now = clock(ARGV[1])
local period, limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local key = KEYS[1]

local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[2] then
  now = math.max(now, tonumber(newest[2])) -- the key's clock never runs backwards
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - period))
local n = redis.call('ZCARD', key)

local allowed, retry = 0, 0
if n + cost <= limit then
  allowed = 1
  -- Members of one instant are numbered on from those already there, which are 0..k-1:
  -- none of them can have left the window, since the clock never runs backwards.
  local stamp = string.format('%.0f', now)
  local k = redis.call('ZCOUNT', key, stamp, stamp)
  local args = {}
  for i = 0, cost - 1 do
    args[#args + 1] = stamp
    args[#args + 1] = stamp .. ':' .. (k + i)
    if #args >= 1000 or i == cost - 1 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  n = n + cost
else
  local k = n + cost - limit -- entries that must leave first
  local e = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  retry = tonumber(e[2]) + period - now
end

local reset = 0
if n > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  reset = tonumber(last[2]) + period - now
  redis.call('PEXPIRE', key, ttl_ms(reset))
end
return {allowed, math.max(0, limit - n), reset, retry, now}
