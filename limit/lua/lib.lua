-- lib.lua is prepended to every script in this directory (see limit/redis.go). It holds the
-- integer arithmetic the scripts share with limit/algorithms.go. Lua numbers are doubles: every
-- value here is a whole number below 2^53 (Limit.Validate keeps them there), so it is exact.

-- fdiv returns floor(a / b) for whole numbers a >= 0, b > 0. The float quotient can round up
-- to the next whole number; the products, which are exact, correct it.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- cdiv returns ceil(a / b) for whole numbers a >= 0, b > 0.
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- clock returns now in microseconds since the Unix epoch: the server's TIME, one clock for
-- every client, unless the caller passed an instant (tests with fixed instants do). Redis
-- measures TTLs on its own clock, which passed instants do not follow; so that a key does not
-- vanish while it matters at the passed instants, TTLs are then at least an hour (fixed_clock).
local fixed_clock = false
local function clock(arg)
  if arg ~= '' then
    fixed_clock = true
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- ttl_ms converts the µs until a key's state is idle to its TTL in milliseconds, rounded up.
local function ttl_ms(us)
  if fixed_clock then
    us = math.max(us, 3600000000)
  end
  return math.max(1, cdiv(us, 1000))
end

-- charge_once records the extra charge id (a decimal ChargeID; '0': none, not recorded) among
-- the charges made to a key's state, in marks (a sorted set beside the state, in its hash
-- slot, scored by now), and reports whether it was not recorded yet: a charge recorded is not
-- made again (ErrChargeMade in limit.go). Marks live mark_ttl µs, at most mark_max a key
-- (limit.ChargeMarkTTL and limit.MaxChargeMarks).
local mark_ttl, mark_max = 300000000, 8192
local function charge_once(marks, id, now)
  if id == '0' then
    return true
  end
  if redis.call('ZADD', marks, 'NX', now, id) == 0 then
    return false
  end
  -- Marks beyond mark_max and expired ones go with one charge in 25 (an ID ending in 00, 32,
  -- 64 or 96: IDs are random), so a key holds a few dozen more than that at most.
  if tonumber(string.sub(id, -2)) % 32 == 0 then
    redis.call('ZREMRANGEBYSCORE', marks, '-inf', string.format('%.0f', now - mark_ttl))
    redis.call('ZREMRANGEBYRANK', marks, 0, -mark_max - 1)
  end
  redis.call('PEXPIRE', marks, ttl_ms(mark_ttl))
  return true
end

-- State is stored as a string of base-128 varints (7 bits a byte, low bits first, the high bit
-- set on every byte but a number's last): about half the bytes of decimal text, which keeps a
-- bucket's value short enough for Redis's smallest string allocations. Division by 128 is exact
-- on doubles, so encoding is exact for every whole number below 2^53.

-- get_state returns the n whole numbers stored at key, or nil when there are none (or the value
-- is not n varints); with m, it accepts n to m of them.
local function get_state(key, n, m)
  m = m or n
  local v = redis.call('GET', key)
  if not v or #v > 8 * m then -- absent, or not what set_state writes
    return nil
  end
  local out, x, mul = {}, 0, 1
  local bytes = {string.byte(v, 1, -1)}
  for i = 1, #bytes do
    local b = bytes[i]
    if b >= 128 then
      x, mul = x + (b - 128) * mul, mul * 128
    else
      out[#out + 1] = x + b * mul
      x, mul = 0, 1
    end
  end
  if #out < n or #out > m or mul ~= 1 then
    return nil
  end
  return out
end

-- set_state stores whole numbers >= 0 at key until the state is idle, ttl µs from now.
local function set_state(key, ttl, ...)
  local bytes = {}
  for _, v in ipairs({...}) do
    assert(v >= 0, 'limit: a negative state') -- would never end the loop below
    repeat
      local b = v % 128
      v = (v - b) / 128
      if v > 0 then
        b = b + 128
      end
      bytes[#bytes + 1] = b
    until v == 0
  end
  redis.call('SET', key, string.char(unpack(bytes)), 'PX', ttl_ms(ttl))
end

-- rescale converts v from one scale to another after the limit changed, rounding exactly as
-- the Go code does (IEEE division, then multiplication, then floor).
local function rescale(v, from, to)
  return math.floor(v / from * to)
end


-- unrepaid returns how much of a charge of charged requests at at (µs) a bucket has not
-- refilled by now, in its scaled units: charged * unit - (now - at) * refill, at least 0; the
-- most a refund of that charge may give back (unrepaid in limit/algorithms.go).
local function unrepaid(unit, refill, at, charged, now)
  local c = charged * unit
  if now <= at then
    return c
  end
  if now - at >= cdiv(c, refill) then
    return 0
  end
  return c - (now - at) * refill
end

-- carry returns what a window count of c leaves to count after k windows have ended, limit of
-- it in each (carry in limit/algorithms.go): a count above limit is debt.
local function carry(c, k, limit)
  if c <= 0 or k >= cdiv(c, limit) then
    return 0
  end
  return c - k * limit
end

-- windows_wait returns the µs until a window whose carried count is at most target starts,
-- for a count of c and left µs left in the current window (windowsWait in algorithms.go).
local function windows_wait(c, target, limit, period, left)
  if c <= target then
    return 0
  end
  return left + (math.max(1, cdiv(c - target, limit)) - 1) * period
end

-- window_rolls returns how many windows of period have ended from the one that started at
-- start to the one that starts at w (~= start): one at least, as a window of a period
-- changed since may start after w (fixedWindowState.roll in algorithms.go).
local function window_rolls(start, w, period)
  if w < start then
    return 1
  end
  return math.max(1, fdiv(w - start, period))
end

-- slide_roll returns prev and cur after the windows from start to w have ended
-- (slidingWindowState.roll in algorithms.go).
local function slide_roll(prev, cur, start, w, period, limit)
  if w ~= start then
    local k = window_rolls(start, w, period)
    prev, cur = math.min(carry(cur, k - 1, limit), limit), carry(cur, k, limit)
  end
  return math.min(prev, limit), cur
end

-- slide_wait returns the µs until the sliding window estimate of prev and cur is at most
-- target, if nothing more is admitted; left is the µs left in the current window
-- (slidingWait in algorithms.go: window after window while debt is counted).
local function slide_wait(prev, cur, period, left, target, limit)
  local wait = 0
  while true do
    if cur <= target then
      if prev == 0 then
        return wait
      end
      local xmax = cdiv((target - cur + 1) * period, prev) - 1
      if xmax >= 1 then
        return wait + math.max(0, left - xmax)
      end
    end
    prev, cur = math.min(cur, limit), carry(cur, 1, limit)
    wait, left = wait + left, period
  end
end
