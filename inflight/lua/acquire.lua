-- acquire.lua: takes one place under every cap at once, or none. Clock: the server's TIME, so
-- that every host agrees on when a place expires.
--
-- KEYS[i]    i ≤ n: the places of cap i: a sorted set, member = lease id, score = the place's
--            expiry in µs since the Unix epoch. The key expires (PEXPIRE) with the latest place
--            it holds. All KEYS are in one hash slot.
-- KEYS[n+i]  only when ARGV[3] > 0: cap i's waiting mark, a string that exists while some
--            Wait is refused a place of the cap (release.lua publishes only then)
-- ARGV[1]    the new lease's id
-- ARGV[2]    hold in µs (> 0)
-- ARGV[3]    ms a refusal marks the full caps as waited for; 0 = mark nothing (an Acquire
--            outside a Wait)
-- ARGV[3+i]  the limit of cap i (>= 1); n = #ARGV − 3
-- Returns    {acquired (1 or 0), retry_after µs, held_1, ..., held_n}: held_i is the number of
--            unexpired places of cap i after the call (the new one included when acquired);
--            retry_after is 0 when acquired, else the longest, over the full caps, of the time
--            until the cap's earliest place expires.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowS = string.format('%.0f', now)
local n = #ARGV - 3
local mark = tonumber(ARGV[3])
local held, wait, full = {}, 0, false
for i = 1, n do
  local key = KEYS[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', nowS) -- a place expires when now reaches its score
  local c = redis.call('ZCARD', key)
  held[i] = c
  if c >= tonumber(ARGV[3 + i]) then
    full = true
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(first[2]) - now)
    if mark > 0 and KEYS[n + i] then
      redis.call('SET', KEYS[n + i], '1', 'PX', mark)
    end
  end
end
if full then
  return {0, wait, unpack(held)}
end
local expS = string.format('%.0f', now + tonumber(ARGV[2]))
for i = 1, n do
  local key = KEYS[i]
  redis.call('ZADD', key, expS, ARGV[1])
  held[i] = held[i] + 1
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.ceil((tonumber(last[2]) - now) / 1000))
end
return {1, 0, unpack(held)}
