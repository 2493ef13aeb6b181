-- acquire.lua: takes one place under every cap at once, or none. Clock: the server's TIME, so
-- that every host agrees on when a place expires.
--
-- KEYS[i]    the places of cap i: a sorted set, member = lease id, score = the place's expiry
--            in µs since the Unix epoch. The key expires (PEXPIRE) with the latest place it
--            holds; all KEYS are in one hash slot.
-- ARGV[1]    the new lease's id
-- ARGV[2]    hold in µs (> 0)
-- ARGV[2+i]  the limit of cap i (>= 1)
-- Returns    {acquired (1 or 0), retry_after µs, held_1, ..., held_n}: held_i is the number of
--            unexpired places of cap i after the call (the new one included when acquired);
--            retry_after is 0 when acquired, else the longest, over the full caps, of the time
--            until the cap's earliest place expires.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowS = string.format('%.0f', now)
local held, wait, full = {}, 0, false
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', nowS) -- a place expires when now reaches its score
  local n = redis.call('ZCARD', key)
  held[i] = n
  if n >= tonumber(ARGV[2 + i]) then
    full = true
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(first[2]) - now)
  end
end
if full then
  return {0, wait, unpack(held)}
end
local expS = string.format('%.0f', now + tonumber(ARGV[2]))
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, expS, ARGV[1])
  held[i] = held[i] + 1
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.ceil((tonumber(last[2]) - now) / 1000))
end
return {1, 0, unpack(held)}
