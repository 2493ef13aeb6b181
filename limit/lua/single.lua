-- single.lua wraps one decision script (see luaSources in limit/redis.go): the epoch check of
-- epoch.lua, then the algorithm's file, then the reply with the epoch id appended. Both read
-- the one instant taken here: the algorithm's clock() returns it rather than a second TIME.
-- KEYS[2] is the epoch key; ARGV[#ARGV-2] the epoch the caller knows, ARGV[#ARGV-1] the reset
-- hold of its limit, ARGV[#ARGV] 1 on a Redis Cluster, else 0 (epoch.lua).
local epoch_now = clock(ARGV[1])
local clock = function() return epoch_now end
local epoch_id, epoch_lost = epoch_check(KEYS[2], tonumber(ARGV[#ARGV - 2]), epoch_now, tonumber(ARGV[#ARGV]))
local epoch_hold = tonumber(ARGV[#ARGV - 1])
if epoch_hold > 0 and epoch_lost > 0 and epoch_now < epoch_lost + epoch_hold then
  local wait = epoch_lost + epoch_hold - epoch_now
  return {0, 0, wait, wait, epoch_now, epoch_id}
end
local epoch_reply = (function()
