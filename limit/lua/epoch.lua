-- epoch.lua is part of every decision script (see luaSources in limit/redis.go): epoch_check
-- checks the epoch of the rule state's group before the algorithms decide, once per script run
-- (single.lua for one decision, multi.lua for several of one group). Clock: the decisions'.
--
-- The epoch key (one per store on a single Redis, one per hash slot on a Redis Cluster, never
-- expiring) is a hash:
--   id    the epoch: µs of the server's TIME when the key was made
--   born  when it was made, on the decision's clock
--   lost  when a loss of state was learned, on the decision's clock; absent: never
--   node  on a Redis Cluster, the id (CLUSTER MYID) of the node that made or adopted it
-- The caller passes the epoch it knows ('0' for none), 1 on a Redis Cluster (else 0) and, per
-- decision, the reset hold of its limit in µs: 0 for on_store_reset fresh, else how long after
-- a loss the limit refuses every request (the time it takes to become whole from empty). A
-- caller that knew an epoch and finds none, or an older one (a restart without persistence, a
-- FLUSHALL, a restore that lost writes), has learned of a loss: lost is set to now, or to the
-- new epoch's birth when a caller that knew nothing made it first. On a Redis Cluster a key
-- made on another node came with a failover (a promoted replica that may have missed the last
-- writes) or a slot's migration: whoever calls makes a new epoch and sets lost to now. A key
-- without a node (made before nodes were recorded) is adopted.
-- epoch_check returns the epoch id and lost (0: never). A decision within the reset hold of
-- lost is a refusal that charges nothing: {0, 0, wait, wait, now}, wait the rest of the hold.
local function epoch_check(key, known, now, cluster)
  local e = redis.call('HMGET', key, 'id', 'born', 'lost', 'node')
  local id, born, lost = tonumber(e[1]), tonumber(e[2]) or 0, tonumber(e[3]) or 0
  local node, moved = nil, false
  if cluster == 1 then
    node = redis.call('CLUSTER', 'MYID')
    moved = id and e[4] and e[4] ~= node
    if id and not e[4] then
      redis.call('HSET', key, 'node', node)
    end
  end
  if not id or known > id or moved then
    local t = redis.call('TIME')
    id, born, lost = tonumber(t[1]) * 1000000 + tonumber(t[2]), now, 0
    redis.call('DEL', key)
    redis.call('HSET', key, 'id', string.format('%.0f', id), 'born', string.format('%.0f', now))
    if node then
      redis.call('HSET', key, 'node', node)
    end
    if known > 0 or moved then
      lost = now
      redis.call('HSET', key, 'lost', string.format('%.0f', now))
    end
  elseif known > 0 and known ~= id and lost < born then
    lost = born
    redis.call('HSET', key, 'lost', string.format('%.0f', born))
  end
  return id, lost
end
