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

-- get_state returns the n whole numbers stored at key, or nil when there are none (or they are
-- not n whole numbers).
local function get_state(key, n)
  local v = redis.call('GET', key)
  if not v then
    return nil
  end
  local out = {}
  for x in string.gmatch(v, '%d+') do
    out[#out + 1] = tonumber(x)
  end
  if #out ~= n then
    return nil
  end
  return out
end

-- set_state stores whole numbers at key, space-separated, until it is idle ttl µs from now.
-- string.format, because tostring switches to exponents above 1e14.
local function set_state(key, ttl, ...)
  local parts = {}
  for i, v in ipairs({...}) do
    parts[i] = string.format('%.0f', v)
  end
  redis.call('SET', key, table.concat(parts, ' '), 'PX', ttl_ms(ttl))
end

-- rescale converts v from one scale to another after the limit changed, rounding exactly as
-- the Go code does (IEEE division, then multiplication, then floor).
local function rescale(v, from, to)
  return math.floor(v / from * to)
end

