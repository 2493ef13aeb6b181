-- takecost.lua — reserve the next delivery slot of one queue for a job of some cost: one slot
-- that satisfies both the request schedule (take.lua) and the queue's unit schedule.
--
-- KEYS[1]  the queue's state, a hash: {<prefix>leak:<queue>}, with take.lua's fields and
--            utat      µs, the unit schedule's theoretical arrival time (GCRA, pay after: a job
--                      goes once utat − unit tolerance has passed, and moves utat by its units)
--            uslot     µs, the latest slot a takecost reserved (reconcile.lua's clamp)
--            ucharged  µs of units ever charged to the unit schedule (never lowered by refunds)
-- ARGV[1]  interval, µs, > 0 (the request rate, as take.lua)
-- ARGV[2]  burst, ≥ 0 (as take.lua)
-- ARGV[3]  inc, µs: the job's units at the unit rate, cost × per / N rounded up to a µs
-- ARGV[4]  unit tolerance, µs: cost_burst × per / N rounded down
-- ARGV[5]  ahead, µs, ≥ 0: reserve nothing when the units come later than now + ahead (0: no limit)
-- ARGV[6]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  {wait, reserved, epoch, now, utat, ucharged}, integer µs:
--          reserved = 1: wait = slot − now ≥ 0, utat and ucharged after the take;
--          reserved = 0: nothing was changed, ask again after wait.
--
-- Time source: the Redis server's TIME (see take.lua). All arithmetic in integer µs, exact in
-- Lua's doubles (the Go side computes the increments exactly, bounded by 2^50).
--
-- The model: s = max(now, the request schedule's slot, the unit schedule's slot); both advance
-- from s (TAT = max(TAT, s) + increment), so neither budget waits for the other for nothing. A
-- pause uses up both bursts, as in take.lua.
if redis.replicate_commands then redis.replicate_commands() end

local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local inc = tonumber(ARGV[3])
local ut = tonumber(ARGV[4])
local ahead = tonumber(ARGV[5])
local now
if ARGV[6] then
  now = tonumber(ARGV[6])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local st = redis.call('HMGET', key, 'last', 'paused_until', 'epoch', 'utat', 'uslot', 'ucharged')
local last = tonumber(st[1])
local pu = tonumber(st[2])
local epoch = tonumber(st[3]) or now
local utat = tonumber(st[4]) or 0
local uslot = tonumber(st[5]) or 0
local charged = tonumber(st[6]) or 0
local bt = burst * interval

local tat = now
if last and last + interval > tat then tat = last + interval end
if pu then
  if pu + bt > tat then tat = pu + bt end
  if pu + ut > utat then utat = pu + ut end
end
local unext = utat - ut
if ahead > 0 and unext > now + ahead then
  return {unext - now - ahead, 0, epoch, now, 0, 0}
end
local slot = tat - bt
if slot < now then slot = now end
if unext > slot then slot = unext end
if slot > tat then tat = slot end
if slot > utat then utat = slot end
utat = utat + inc
if slot > uslot then uslot = slot end
charged = charged + inc

redis.call('HSET', key, 'last', tat, 'bt', bt, 'epoch', epoch, 'utat', utat, 'uslot', uslot, 'ucharged', charged)
-- Keep the state while it still matters (until both TATs and the pause's burst recovery have
-- passed) plus a minute of slack, as take.lua. A lost unit state restarts at now, with the epoch.
local until_ = tat + interval
if utat > until_ then until_ = utat end
if pu and pu + bt > until_ then until_ = pu + bt end
redis.call('PEXPIRE', key, math.floor((until_ - now) / 1000) + 60000)

return {slot - now, 1, epoch, now, utat, charged}
