-- adapt.lua — change a queue's learned rate (adaptive drain, AIMD), shared by every worker.
--
-- KEYS[1]  the queue's adaptive state, a hash in the queue's slot: {<prefix>leak:<queue>}:adapt
--            eff     deliveries/s the upstream is believed to take now
--            dec_at  µs, when the last multiplicative decrease happened
--            peak    deliveries/s the rate was at when it was last decreased: within 15% of it,
--                    increases are a twentieth as large (a hundredth within 5%), so the rate
--                    lingers just below where the upstream pushed back instead of running into it
--                    again at once, and a
--                    decrease steps down half as far ((1 + factor) / 2)
-- ARGV[1]  ceiling, deliveries/s (> 0): the queue's rate; eff never exceeds it
-- ARGV[2]  floor, deliveries/s (> 0, ≤ ceiling): eff never goes below it
-- ARGV[3]  1 to decrease multiplicatively (an upstream 429/503), else 0
-- ARGV[4]  factor of the decrease, in (0, 1)
-- ARGV[5]  hold, µs: a decrease within hold of the last one is skipped, so that the workers
--          that all met the same push-back halve the rate once, not once each
-- ARGV[6]  increase, deliveries/s to add (≥ 0)
-- ARGV[7]  target, deliveries/s, 0 for none: the rate the upstream's remaining quota allows
--          (RateLimit / X-RateLimit-Remaining over the reset); eff is lowered to it
-- ARGV[8]  ttl, ms: the state is forgotten after this long without a change, so a long quiet
--          spell brings the queue back to its ceiling
-- ARGV[9]  optional: "now" in µs, a test-only override of the clock
--
-- Returns  {eff as a string, 1 if this call decreased it else 0}
--
-- Time source: the Redis server's TIME (see take.lua).
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local ceiling, floor = tonumber(ARGV[1]), tonumber(ARGV[2])
local decrease, factor, hold = ARGV[3] == '1', tonumber(ARGV[4]), tonumber(ARGV[5])
local increase, target, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local now
if ARGV[9] then
  now = tonumber(ARGV[9])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local st = redis.call('HMGET', key, 'eff', 'dec_at', 'peak')
local eff = tonumber(st[1]) or ceiling
local decAt = tonumber(st[2]) or 0
local peak = tonumber(st[3]) or 0
if eff > ceiling then eff = ceiling end
local decreased = 0
if target > 0 and target < eff then eff = target end
if decrease and now - decAt >= hold then
  -- Pushed back again near where it last was: the upstream's capacity is about here, so step
  -- down half as far.
  if peak > 0 and eff >= 0.85 * peak then factor = (1 + factor) / 2 end
  peak = eff
  eff = eff * factor
  decAt = now
  decreased = 1
end
if peak > 0 and eff >= 0.95 * peak then
  increase = increase / 100
elseif peak > 0 and eff >= 0.85 * peak then
  increase = increase / 20
end
eff = eff + increase
if eff > ceiling then eff = ceiling end
if eff < floor then eff = floor end
redis.call('HSET', key, 'eff', tostring(eff), 'dec_at', decAt, 'peak', tostring(peak))
redis.call('PEXPIRE', key, ttl)
return {tostring(eff), decreased}
