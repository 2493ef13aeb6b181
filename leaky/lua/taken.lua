-- taken.lua — reserve the next n delivery slots of one queue at once: take.lua run n times in
-- one script, at one instant of the server's clock (see take.lua for the model and the keys).
--
-- KEYS[1]  the queue's state, a hash: {<prefix>leak:<queue>}
-- ARGV[1]  interval, µs, > 0
-- ARGV[2]  burst, ≥ 0
-- ARGV[3]  n, ≥ 1: the slots to reserve
-- ARGV[4]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  {now, epoch, paused_until, wait_1, …, wait_n}, integer µs: wait_i = slot_i − now ≥ 0,
--          slots in order, each one interval after the last (or at once, within the burst).
if redis.replicate_commands then redis.replicate_commands() end

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
local until_ = tat + interval
if pu and pu + bt > until_ then until_ = pu + bt end
redis.call('PEXPIRE', key, math.floor((until_ - now) / 1000) + 60000)

return out
