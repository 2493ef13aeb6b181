-- take.lua — reserve the next n delivery slots of one queue (GCRA-style, with reservation): a
-- take's step run n times, at one instant of the server's clock (n = 1 for a single Take).
--
-- KEYS[1]  the queue's state, a hash: {<prefix>leak:<queue>}
--            last          µs, theoretical arrival time of the most recent reservation
--            bt            µs, burst tolerance (burst × interval) of the most recent take
--            paused_until  µs, no slot starts before it (set by pause.lua)
--            epoch         µs, when this state was created; changes only if the state was lost
-- ARGV[1]  interval, µs, > 0 (the spacing of slots; the current rate, so a change applies now)
-- ARGV[2]  burst, ≥ 0 (slots available at once after idleness, beyond the first)
-- ARGV[3]  n, ≥ 1: the slots to reserve
-- ARGV[4]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  {now, epoch, paused_until, wait_1, …, wait_n}, all integer µs: wait_i = slot_i − now
--          ≥ 0 (0 = go now), slots in order, each one interval after the last (or at once,
--          within the burst); paused_until = 0 when the queue was never paused.
--
-- Time source: the Redis server's TIME, so every worker on every host shares one clock and the
-- wait it is told is relative; hosts' clocks never matter. All arithmetic is in integer µs, exact
-- in Lua's doubles up to 2^53 µs (285 years).
--
-- The model: the TAT of the next reservation is last + interval (interval of this take, so a rate
-- change applies to the very next gap), never before now (idleness does not bank slots), and never
-- before paused_until + bt (a pause uses up the burst: slots resume at the plain rate). The slot
-- itself may be up to bt earlier than the TAT, but never before now.
if redis.replicate_commands then redis.replicate_commands() end -- Redis < 5: allow TIME, then writes

local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local st = redis.call('HMGET', key, 'last', 'paused_until', 'epoch')
local last = tonumber(st[1])
local pu = tonumber(st[2])
local epoch = tonumber(st[3]) or now
local bt = burst * interval

local out = {now, epoch, pu or 0}
local tat = now
for i = 1, n do
  tat = now
  if last and last + interval > tat then tat = last + interval end
  if pu and pu + bt > tat then tat = pu + bt end
  local slot = tat - bt
  if slot < now then slot = now end
  out[3 + i] = slot - now
  last = tat
end

redis.call('HSET', key, 'last', tat, 'bt', bt, 'epoch', epoch)
-- Keep the state while it still matters (until the next TAT and the pause's burst recovery
-- have passed) plus a minute of slack; after that a fresh state behaves the same.
local until_ = tat + interval
if pu and pu + bt > until_ then until_ = pu + bt end
redis.call('PEXPIRE', key, math.floor((until_ - now) / 1000) + 60000)

return out
