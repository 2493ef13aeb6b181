-- pause.lua — pause a queue: no slot starts before now + d, for every worker.
--
-- KEYS[1]  the queue's state hash (see take.lua): reads paused_until and bt, writes paused_until
-- ARGV[1]  d, µs, > 0
-- ARGV[2]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  the remaining pause in µs after this call (≥ d; more when an existing pause is longer,
--          which this call then leaves as it is).
--
-- Time source: the Redis server's TIME (see take.lua).
if redis.replicate_commands then redis.replicate_commands() end

local key = KEYS[1]
local d = tonumber(ARGV[1])
local now
if ARGV[2] then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local st = redis.call('HMGET', key, 'paused_until', 'bt')
local pu = tonumber(st[1])
local bt = tonumber(st[2]) or 0
local want = now + d
if pu and pu >= want then
  return pu - now
end

redis.call('HSET', key, 'paused_until', want)
-- Keep the state until the pause and the burst recovery after it are over (plus slack, as in
-- take.lua), and never shorten what take.lua asked for.
local ttl = math.floor((want + bt - now) / 1000) + 60000
local cur = redis.call('PTTL', key)
if cur > ttl then ttl = cur end
redis.call('PEXPIRE', key, ttl)
return want - now
