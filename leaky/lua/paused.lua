-- paused.lua — how long a queue stays paused, and whether a reservation is still valid.
--
-- KEYS[1]  the queue's state hash (see take.lua); read only
-- ARGV[1]  epoch of a reservation to check, µs; 0 = no check
-- ARGV[2]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  {paused, valid, now, epoch}: paused = paused_until − now in µs, ≥ 0 (0 = not paused);
--          valid = 1 when ARGV[1] is 0 or equals the state's epoch, else 0 (the state the
--          reservation was made in has been lost, e.g. by a Redis restart, so the reservation
--          no longer counts and must not be used); now = the server's clock, µs, with which the
--          caller places its slot on its own clock again; epoch = the state's epoch (0 when
--          the queue has no state).
--
-- Time source: the Redis server's TIME (see take.lua).
local key = KEYS[1]
local want = tonumber(ARGV[1])
local now
if ARGV[2] then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local st = redis.call('HMGET', key, 'paused_until', 'epoch')
local pu = tonumber(st[1]) or 0
local epoch = tonumber(st[2])
local paused = pu - now
if paused < 0 then paused = 0 end
local valid = 1
if want ~= 0 and epoch ~= want then valid = 0 end
return {paused, valid, now, epoch or 0}
