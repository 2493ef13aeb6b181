-- count.lua: the places held under one cap. Clock: the server's TIME. Read-only.
--
-- KEYS[1]    the places of a cap: a sorted set as in acquire.lua
-- Returns    the number of unexpired places (score > now)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.0f', now), '+inf')
