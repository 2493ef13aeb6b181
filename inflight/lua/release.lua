-- release.lua: gives a lease's places back. Clock: the server's TIME (to tell a live place from
-- an expired one).
--
-- KEYS[i]    i ≤ ARGV[4]: the lease's keys, sorted sets as in acquire.lua, all in one hash slot
-- KEYS[n+i]  the waiting marks of those keys (acquire.lua), when given: then the release is
--            published only if one of them exists; without them, always
-- ARGV[1]    the lease id
-- ARGV[2]    the channel waiters listen on
-- ARGV[3]    the message: the lease's keys, as the store's waiters know them
-- ARGV[4]    n, the number of the lease's keys
-- Returns    the number of live (unexpired) places freed. When it is > 0 and someone waits (or
--            no marks were given) the message has been PUBLISHed on the channel. A lease that
--            expired, was released, or was never given out frees nothing: members are lease
--            ids, so no other lease's place is touched.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[4])
local freed = 0
for i = 1, n do
  local key = KEYS[i]
  local score = redis.call('ZSCORE', key, ARGV[1])
  if score then
    redis.call('ZREM', key, ARGV[1])
    if tonumber(score) > now then
      freed = freed + 1
    end
  end
end
if freed == 0 then
  return 0
end
local waited = #KEYS == n
for i = n + 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    waited = true
    break
  end
end
if waited then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return freed
