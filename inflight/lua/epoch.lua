-- epoch.lua: the epoch of a group of caps, put before acquire.lua, renew.lua and reassert.lua
-- (one script each). Clock: the caller's now, the server's TIME.
--
-- The epoch key (one per group: the caps of one hash tag, in their slot) is a hash:
--   id     the epoch: "<born>:<random>", made when the key was missing
--   born   when it was made, µs of TIME
--   fence  until when no place is granted (µs of TIME), after a loss of state; absent: never
--   exp    when the key expires (µs of TIME); it outlives every place of the group by the fence
--   node   on a Redis Cluster, the id (CLUSTER MYID) of the node that made or last adopted it
-- A caller sends the epoch it knows ("" when none, or when it holds no place of the group and
-- its knowledge has lapsed). A caller that knew an epoch and finds none, or another, has
-- learned that the server lost state (a restart without persistence, a failover, a FLUSHALL):
-- no place is then granted until born + fence_for, by when every place taken before the loss
-- by a holder with this fence_for is out of use, unless its holder re-asserts it.
--
-- On a Redis Cluster (cluster = '1') the key also records the node it was made on. A key this
-- node did not make came with a failover (a replica promoted: asynchronous replication may have
-- lost the last places taken from the old master while it kept the key) or with a slot's
-- migration: it is treated as lost, whoever calls: a new epoch is made, fenced from now, and
-- every process that knew the old one re-asserts its places. A key without the field (made
-- before it was recorded) is adopted. One CLUSTER MYID per call, no round trip more.
--
-- epoch(key, known, candidate, now, hold, fence_for, cluster) returns the current epoch, the
-- fence's end (0: none) and whether the caller learned of a loss. It keeps the key alive for
-- at least hold + fence_for from now (writing only when that moves past exp; then to twice it).
local function fmt(x) return string.format('%.0f', x) end

local function epoch(key, known, candidate, now, hold, fenceFor, cluster)
  local e = redis.call('HMGET', key, 'id', 'born', 'fence', 'exp', 'node')
  local id, fence, exp, lost = e[1], tonumber(e[3] or 0) or 0, tonumber(e[4] or 0) or 0, false
  local node, moved = nil, false
  if cluster == '1' then
    node = redis.call('CLUSTER', 'MYID')
    moved = id and e[5] and e[5] ~= node
    if id and not e[5] then
      redis.call('HSET', key, 'node', node)
    end
  end
  if not id or moved then
    id = fmt(now) .. ':' .. candidate
    redis.call('HSET', key, 'id', id, 'born', fmt(now))
    if node then
      redis.call('HSET', key, 'node', node)
    end
    if known ~= '' or moved then -- the first to see the loss, or the failover
      lost, fence = known ~= '', math.max(fence, now + fenceFor)
      redis.call('HSET', key, 'fence', fmt(fence))
    end
  elseif known ~= '' and known ~= id then -- another process saw it first, or made the epoch afresh
    lost = true
    local want = tonumber(e[2]) + fenceFor
    if want > fence then
      fence = want
      redis.call('HSET', key, 'fence', fmt(fence))
    end
  end
  if now + hold + fenceFor > exp then
    exp = now + 2 * (hold + fenceFor)
    redis.call('HSET', key, 'exp', fmt(exp))
    redis.call('PEXPIREAT', key, math.ceil(exp / 1000))
  end
  return id, fence, lost
end

