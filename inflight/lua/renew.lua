-- renew.lua: extends a lease's places to now + hold, if every one of them is still held.
-- Clock: the server's TIME. epoch.lua comes before it.
--
-- KEYS[i]    i ≤ n: the lease's keys: sorted sets as in acquire.lua, all in one hash slot
-- KEYS[n+1]  only when ARGV[4] > 0: the group's epoch key (epoch.lua)
-- ARGV[1]    the lease id
-- ARGV[2]    hold, µs, > 0
-- ARGV[3]    the epoch the caller knows, "" for none
-- ARGV[4]    fence_for in µs (acquire.lua); 0 = no epoch key; n = #KEYS − (1 if ARGV[4] > 0)
-- ARGV[5]    '1' on a Redis Cluster (acquire.lua), else '0'
-- Returns    {status, epoch}: status 1 when every place was live and now expires at now + hold
--            (never earlier than it did); 0 when one had expired or was released: the lease is
--            then removed from every key (its other places are given back, unpublished: no
--            waiter can need the message more than the holder, who acquires again); 2 when the
--            caller learned of a loss: nothing was done, it re-asserts (reassert.lua) and renews
--            again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local hold, fenceFor = tonumber(ARGV[2]), tonumber(ARGV[4])
local want = now + hold
local n, cur = #KEYS, ''
if fenceFor > 0 then
  n = n - 1
  local _, lost
  cur, _, lost = epoch(KEYS[n + 1], ARGV[3], ARGV[1], now, hold, fenceFor, ARGV[5])
  if lost then
    return {2, cur}
  end
end
for i = 1, n do
  local score = redis.call('ZSCORE', KEYS[i], ARGV[1])
  if not score or tonumber(score) <= now then
    for j = 1, n do
      redis.call('ZREM', KEYS[j], ARGV[1])
    end
    return {0, cur}
  end
end
for i = 1, n do
  local key = KEYS[i]
  local score = tonumber(redis.call('ZSCORE', key, ARGV[1]))
  if score < want then
    redis.call('ZADD', key, fmt(want), ARGV[1])
  end
  local ttl = math.floor((want - now) / 1000) + 1
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
return {1, cur}
