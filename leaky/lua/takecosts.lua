-- takecosts.lua — reserve the next delivery slot of one queue for a job charged on several
-- named unit budgets (a queue's budgets): one slot that satisfies the request schedule
-- (take.lua) and every budget's unit schedule, each budget kept in its own key.
--
-- KEYS[1]    the queue's state, a hash: {<prefix>leak:<queue>} (take.lua's fields)
-- KEYS[1+i]  budget i's unit schedule, a hash: {<prefix>leak:<queue>}:budget:<name>, in the
--            same hash slot, with takecost.lua's unit fields (utat, uslot, ucharged) and its
--            own epoch (reconcile.lua reads it as it reads a queue's)
-- ARGV[1]    interval, µs, > 0 (the request rate, as take.lua)
-- ARGV[2]    burst, ≥ 0 (as take.lua)
-- ARGV[3]    ahead, µs, ≥ 0: reserve nothing when some budget's units come later than
--            now + ahead (0: no limit)
-- ARGV[4]    "now" in µs, a test-only override of the clock; -1: the server's TIME
-- ARGV[3+2i], ARGV[4+2i]  budget i's inc and unit tolerance, µs, as takecost.lua's
--
-- Returns  {wait, reserved, epoch, now, then per budget utat, ucharged, epoch}:
--          reserved = 1: wait = slot − now ≥ 0, each budget's state after the take;
--          reserved = 0: nothing was changed, ask again after wait.
--
-- The model is takecost.lua's with several unit schedules: s = max(now, the request
-- schedule's slot, every budget's slot); all advance from s. A pause uses up every burst.
if redis.replicate_commands then redis.replicate_commands() end

local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local ahead = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = #KEYS - 1

local st = redis.call('HMGET', KEYS[1], 'last', 'paused_until', 'epoch')
local last = tonumber(st[1])
local pu = tonumber(st[2])
local epoch = tonumber(st[3]) or now
local bt = burst * interval

local tat = now
if last and last + interval > tat then tat = last + interval end
if pu and pu + bt > tat then tat = pu + bt end
local slot = tat - bt
if slot < now then slot = now end

local us = {}
local latest = now
for i = 1, n do
  local b = redis.call('HMGET', KEYS[1 + i], 'epoch', 'utat', 'uslot', 'ucharged')
  local u = {epoch = tonumber(b[1]) or now, utat = tonumber(b[2]) or 0, uslot = tonumber(b[3]) or 0,
    charged = tonumber(b[4]) or 0, inc = tonumber(ARGV[3 + 2 * i]), ut = tonumber(ARGV[4 + 2 * i])}
  if pu and pu + u.ut > u.utat then u.utat = pu + u.ut end
  local unext = u.utat - u.ut
  if unext > latest then latest = unext end
  us[i] = u
end
if ahead > 0 and latest > now + ahead then
  return {latest - now - ahead, 0, epoch, now}
end
if latest > slot then slot = latest end
if slot > tat then tat = slot end

redis.call('HSET', KEYS[1], 'last', tat, 'bt', bt, 'epoch', epoch)
local until_ = tat + interval
if pu and pu + bt > until_ then until_ = pu + bt end
redis.call('PEXPIRE', KEYS[1], math.floor((until_ - now) / 1000) + 60000)

local out = {slot - now, 1, epoch, now}
for i = 1, n do
  local u = us[i]
  if slot > u.utat then u.utat = slot end
  u.utat = u.utat + u.inc
  if slot > u.uslot then u.uslot = slot end
  u.charged = u.charged + u.inc
  redis.call('HSET', KEYS[1 + i], 'epoch', u.epoch, 'utat', u.utat, 'uslot', u.uslot, 'ucharged', u.charged)
  local keep = u.utat
  if pu and pu + u.ut > keep then keep = pu + u.ut end
  redis.call('PEXPIRE', KEYS[1 + i], math.floor((keep - now) / 1000) + 60000)
  out[#out + 1] = u.utat
  out[#out + 1] = u.charged
  out[#out + 1] = u.epoch
end
return out
