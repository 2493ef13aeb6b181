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
-- ARGV[3]    1 on a Redis Cluster, else 0 (epoch.lua)
-- then for each request, in the order of KEYS: its algorithm (0 token_bucket, 1 leaky_bucket,
--            2 fixed_window, 3 sliding_log, 4 sliding_window, 5 gcra), the reset hold of its
--            limit in µs (epoch.lua), and its script's ARGV[2..] (5 for the token bucket, 4
--            for the leaky bucket and gcra, 3 for the windows and the log)
-- Returns    {allowed, remaining, reset_after µs, retry_after µs, at µs} for each request,
--            flat and in order, then the epoch id
local multi_now = clock(ARGV[1])
local clock = function() return multi_now end
local nargs = {[0] = 5, [1] = 4, [2] = 3, [3] = 3, [4] = 3, [5] = 4}
local algs = {}
-- ALGORITHMS (limit/redis.go puts algs[i] = function(KEYS, ARGV) <i's file> end here)

local epoch_id, epoch_lost = epoch_check(KEYS[1], tonumber(ARGV[2]), multi_now, tonumber(ARGV[3]))
local out, o, a = {}, 0, 4
for k = 2, #KEYS do
  local alg, hold = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local r
  if hold > 0 and epoch_lost > 0 and multi_now < epoch_lost + hold then
    local wait = epoch_lost + hold - multi_now
    r = {0, 0, wait, wait, multi_now}
  else
    -- The script's ARGV in one constructor; one with fewer arguments than the token bucket
    -- gets the next request's first ones after its own, which it does not read.
    r = algs[alg]({KEYS[k]}, {ARGV[1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]})
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = r[1], r[2], r[3], r[4], r[5]
  o, a = o + 5, a + 2 + nargs[alg]
end
out[o + 1] = epoch_id
return out
