-- acquire.lua: takes one place under every cap at once, or none. Clock: the server's TIME, so
-- that every host agrees on when a place expires. epoch.lua comes before it.
--
-- KEYS[i]    i ≤ n: the places of cap i: a sorted set, member = lease id, score = the place's
--            expiry in µs since the Unix epoch. The key expires (PEXPIRE) with the latest place
--            it holds. All KEYS are in one hash slot.
-- KEYS[n+1]  only when ARGV[5] > 0: the group's epoch key (epoch.lua)
-- KEYS[n+e+i] only when ARGV[3] > 0 (e = 1 with an epoch key, else 0): cap i's waiting mark, a
--            string that exists while some Wait is refused a place of the cap (release.lua
--            publishes only then)
-- ARGV[1]    the new lease's id
-- ARGV[2]    hold in µs (> 0)
-- ARGV[3]    ms a refusal marks the full caps as waited for; 0 = mark nothing (an Acquire
--            outside a Wait)
-- ARGV[4]    the epoch the caller knows, "" for none
-- ARGV[5]    fence_for in µs: the fence a loss this caller learns of sets, from the epoch's
--            birth; 0 = the caps have no epoch key (no loss is detected)
-- ARGV[6]    '1' on a Redis Cluster: the epoch key records its node (epoch.lua), else '0'
-- ARGV[6+i]  the limit of cap i (>= 1); n = #ARGV − 6
-- Returns    {acquired (1 or 0), retry_after µs, epoch, held_1, ..., held_n}: held_i is the
--            number of unexpired places of cap i after the call (the new one included when
--            acquired); retry_after is 0 when acquired, the time left of the fence while one
--            stands, else the longest, over the full caps, of the time until the cap's earliest
--            place expires. A caller that learned of a loss is refused (retry_after 0 when the
--            fence is over): it re-asserts its places (reassert.lua) before it takes more.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowS = fmt(now)
local n = #ARGV - 6
local hold, mark, fenceFor = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local cur, fence, lost, e = '', 0, false, 0
if fenceFor > 0 then
  e = 1
  cur, fence, lost = epoch(KEYS[n + 1], ARGV[4], ARGV[1], now, hold, fenceFor, ARGV[6])
end
local blocked = lost or fence > now
local held, wait, full = {}, 0, false
for i = 1, n do
  local key = KEYS[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', nowS) -- a place expires when now reaches its score
  local c = redis.call('ZCARD', key)
  held[i] = c
  if c >= tonumber(ARGV[6 + i]) then
    full = true
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(first[2]) - now)
    if mark > 0 and not blocked and KEYS[n + e + i] then
      redis.call('SET', KEYS[n + e + i], '1', 'PX', mark)
    end
  end
end
if blocked then
  return {0, math.max(fence - now, 0), cur, unpack(held)}
end
if full then
  return {0, wait, cur, unpack(held)}
end
local expS = fmt(now + hold)
for i = 1, n do
  local key = KEYS[i]
  redis.call('ZADD', key, expS, ARGV[1])
  held[i] = held[i] + 1
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.ceil((tonumber(last[2]) - now) / 1000))
end
return {1, 0, cur, unpack(held)}
