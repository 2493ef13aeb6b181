-- reassert.lua: after a loss of state, puts back the places a process still holds, so that
-- they are counted again when the fence ends. Clock: the server's TIME. epoch.lua comes before
-- it.
--
-- KEYS[1]    the group's epoch key (epoch.lua)
-- KEYS[1+j]  the keys of the leases, in the order of ARGV: sorted sets as in acquire.lua, all in
--            the epoch key's hash slot
-- ARGV[1]    the epoch the leases were taken under (the caller's, before the loss)
-- ARGV[2]    fence_for in µs (acquire.lua)
-- ARGV[3]    a random id, for an epoch made by this call
-- ARGV[4]    the longest time left, in µs, of the leases
-- ARGV[5]    '1' on a Redis Cluster (acquire.lua), else '0'
-- ARGV[6..]  per lease: its id, the time left of its hold in µs, its number of keys
-- Returns    {reasserted (1 or 0), epoch}. While a fence stands, every lease is put back at
--            now + its time left, whatever the caps' limits: these places were counted before
--            the loss, and none was granted since. Once the fence is over nothing is put back
--            (0): by then the places taken before the loss are out of use.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local left = tonumber(ARGV[4])
local cur, fence = epoch(KEYS[1], ARGV[1], ARGV[3], now, left, tonumber(ARGV[2]), ARGV[5])
if cur == ARGV[1] then -- no loss after all: the places are there
  return {1, cur}
end
if fence <= now then
  return {0, cur}
end
local k = 2
local i = 6
while i <= #ARGV do
  local id, exp, m = ARGV[i], now + tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  for j = k, k + m - 1 do
    local key = KEYS[j]
    local score = redis.call('ZSCORE', key, id)
    if not score or tonumber(score) < exp then
      redis.call('ZADD', key, fmt(exp), id)
    end
    local ttl = math.ceil((exp - now) / 1000) + 1
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
  end
  k, i = k + m, i + 3
end
return {1, cur}
