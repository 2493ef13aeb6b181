-- release.lua: gives a lease's places back. Clock: the server's TIME (to tell a live place from
-- an expired one).
--
-- KEYS       the lease's keys: sorted sets as in acquire.lua, all in one hash slot
-- ARGV[1]    the lease id
-- ARGV[2]    the channel waiters listen on
-- ARGV[3]    the message: the lease's keys, as the store's waiters know them
-- Returns    the number of live (unexpired) places freed. When it is > 0 the message has been
--            PUBLISHed on the channel. A lease that expired, was released, or was never given
--            out frees nothing: members are lease ids, so no other lease's place is touched.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local freed = 0
for _, key in ipairs(KEYS) do
  local score = redis.call('ZSCORE', key, ARGV[1])
  if score then
    redis.call('ZREM', key, ARGV[1])
    if tonumber(score) > now then
      freed = freed + 1
    end
  end
end
if freed > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return freed
