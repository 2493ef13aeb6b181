-- reconcile.lua — charge or refund the difference between a delivered job's true cost and its
-- charge on the queue's unit schedule (takecost.lua).
--
-- KEYS[1]  the queue's state hash (see takecost.lua): reads and writes utat and ucharged
-- KEYS[2]  the queue's charges made (in KEYS[1]'s slot): a sorted set of epoch:ARGV[2] of the
--          latest maxMarks charges (d > 0), scored by ARGV[2], expiring with KEYS[1]
-- ARGV[1]  d, µs, ≠ 0: the true cost's units minus the charged ones, at the unit rate
-- ARGV[2]  ucharged right after the job's take (its Charge)
-- ARGV[3]  epoch of the job's take; a different epoch (the state was lost since) changes nothing
--
-- Returns  the unit TAT after the call, µs (0 when nothing was changed).
--
-- A charge (d > 0) moves utat on by d and counts it in ucharged, once: a charge of a take
-- already charged (a call that timed out after the server ran it, made again) changes
-- nothing. A refund (d < 0) moves utat back by |d|, but never before uslot + (ucharged − ARGV[2]): utat is a max-plus recurrence,
-- and the jobs reserved after the refunded one (none slotted after uslot, none charged more
-- than ucharged − ARGV[2]) keep their terms; and never forward. No clock is read.
local key = KEYS[1]
local d = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local want = tonumber(ARGV[3])

local st = redis.call('HMGET', key, 'epoch', 'utat', 'uslot', 'ucharged')
local epoch = tonumber(st[1])
local utat = tonumber(st[2])
if not epoch or epoch ~= want or not utat then return 0 end
local uslot = tonumber(st[3]) or 0
local charged = tonumber(st[4]) or 0

local maxMarks = 4096
local mark = st[1] .. ':' .. ARGV[2]
if d > 0 then
  if redis.call('ZSCORE', KEYS[2], mark) then return 0 end
  redis.call('ZADD', KEYS[2], at, mark)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -maxMarks - 1)
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
  utat = utat + d
  charged = charged + d
else
  local floor = uslot + (charged - at)
  local moved = utat + d
  if floor > moved then moved = floor end
  if moved < utat then utat = moved end
end
redis.call('HSET', key, 'utat', utat, 'ucharged', charged)
return utat
