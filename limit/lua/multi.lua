-- multi.lua decides several requests of one group of keys (the store on a single Redis, one
-- hash slot on a Redis Cluster) in one script run: one TIME, one epoch check (epoch.lua), then
-- each request's algorithm in order, as its own script would decide it (see decideRuns in
-- limit/multi.go). Each algorithm's file is the body of a function here, its KEYS and ARGV
-- those of its own script, and its clock() the one instant of the run.
--
-- KEYS[1]    the group's epoch key (epoch.lua)
-- KEYS[1+i]  the state key of request i
-- ARGV[1]    now in µs since the Unix epoch, or '' for the server's TIME
-- ARGV[2]    the epoch the caller knows ('0' for none)
-- then for each request, in the order of KEYS: its algorithm (0 token_bucket, 1 leaky_bucket,
--            2 fixed_window, 3 sliding_log, 4 sliding_window, 5 gcra), the reset hold of its
--            limit in µs (epoch.lua), and its script's ARGV[2..] (4 for the buckets and gcra,
--            3 for the windows and the log)
-- Returns    {allowed, remaining, reset_after µs, retry_after µs, at µs} for each request,
--            flat and in order, then the epoch id
local multi_now = clock(ARGV[1])
local clock = function() return multi_now end
local nargs = {[0] = 4, [1] = 4, [2] = 3, [3] = 3, [4] = 3, [5] = 4}
local algs = {}
-- ALGORITHMS (limit/redis.go puts algs[i] = function(KEYS, ARGV) <i's file> end here)

local epoch_id, epoch_lost = epoch_check(KEYS[1], tonumber(ARGV[2]), multi_now)
local out, a = {}, 3
for k = 2, #KEYS do
  local alg, hold = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local n = nargs[alg]
  local r
  if hold > 0 and epoch_lost > 0 and multi_now < epoch_lost + hold then
    local wait = epoch_lost + hold - multi_now
    r = {0, 0, wait, wait, multi_now}
  else
    local argv = {ARGV[1]}
    for i = 1, n do
      argv[i + 1] = ARGV[a + 1 + i]
    end
    r = algs[alg]({KEYS[k]}, argv)
  end
  for i = 1, 5 do
    out[#out + 1] = r[i]
  end
  a = a + 2 + n
end
out[#out + 1] = epoch_id
return out
