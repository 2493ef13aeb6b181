-- tenants.lua — the tenants of a queue paused by their upstream (pause_scope: tenant): pause one,
-- and read those still paused.
--
-- KEYS[1]  the queue's tenant pauses, a sorted set: member = tenant, score = paused until (µs)
-- ARGV[1]  tenant to pause, or "" to only read
-- ARGV[2]  d, µs, > 0 (ignored when ARGV[1] is "")
-- ARGV[3]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  a flat array tenant1, remaining1 (µs), tenant2, remaining2, … of the tenants paused
--          after this call. A pause is never shortened: pausing a tenant for less than it is
--          paused already leaves it as it is.
--
-- Time source: the Redis server's TIME (see take.lua). Members whose pause has ended are removed
-- here, and the key expires a minute after its last pause ends, so the set holds the paused
-- tenants only and an idle queue holds nothing.
if redis.replicate_commands then redis.replicate_commands() end

local key = KEYS[1]
local tenant = ARGV[1]
local now
if ARGV[3] then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if tenant ~= '' then
  local want = now + tonumber(ARGV[2])
  local cur = tonumber(redis.call('ZSCORE', key, tenant))
  if not cur or cur < want then
    redis.call('ZADD', key, want, tenant)
  end
end

local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
local last = now
for i = 2, #all, 2 do
  local until_ = tonumber(all[i])
  if until_ > last then last = until_ end
  all[i] = until_ - now
end
if #all > 0 then
  redis.call('PEXPIRE', key, math.floor((last - now) / 1000) + 60000)
end
return all
