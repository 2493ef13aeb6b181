-- renew.lua: extends a lease's places to now + hold, if every one of them is still held.
-- Clock: the server's TIME.
--
-- KEYS       the lease's keys: sorted sets as in acquire.lua, all in one hash slot
-- ARGV[1]    the lease id
-- ARGV[2]    hold, µs, > 0
-- Returns    1 when every place was live and now expires at now + hold (never earlier than it
--            did); 0 when one had expired or was released: the lease is then removed from every
--            key (its other places are given back, unpublished: no waiter can need the
--            message more than the holder, who acquires again).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local want = now + tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local score = redis.call('ZSCORE', key, ARGV[1])
  if not score or tonumber(score) <= now then
    for _, k in ipairs(KEYS) do
      redis.call('ZREM', k, ARGV[1])
    end
    return 0
  end
end
for _, key in ipairs(KEYS) do
  local score = tonumber(redis.call('ZSCORE', key, ARGV[1]))
  if score < want then
    redis.call('ZADD', key, want, ARGV[1])
  end
  local ttl = math.floor((want - now) / 1000) + 1
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
return 1
