-- peaks.lua is prepended, after lib.lua, to the token bucket's scripts (see limit/redis.go):
-- the record of the levels before a bucket's charges that makes its refunds exact. peaks.go in
-- limit/ is the same computation.

-- The record is since, and a list of {at, level, mixed} whose levels fall from oldest to
-- newest. It is stored after the bucket's numbers (see store_peaks). MAX_PEAKS is maxPeaks.
local MAX_PEAKS = 8

-- peaks_read returns the record of a token bucket's state s (the numbers of get_state), whose
-- last instant is last: a state stored without one knows nothing before last.
local function peaks_read(s, last)
  local list = {}
  if #s < 5 then
    return last, list
  end
  for i = 6, #s - 1, 2 do
    local mixed = s[i] % 2
    list[#list + 1] = {last - (s[i] - mixed) / 2, s[i + 1], mixed == 1}
  end
  return last - s[5], list
end

-- peaks_note records that the bucket held level just before a charge at t (peaks.note) and
-- returns since.
local function peaks_note(list, since, t, level)
  if level <= 0 then
    return since
  end
  local mixed = false
  local n = #list
  if n > 0 and list[n][1] == t then
    mixed, level = list[n][3], math.max(level, list[n][2])
    list[n] = nil
    n = n - 1
  end
  while n > 0 and list[n][2] <= level do
    list[n] = nil
    n = n - 1
  end
  if n == MAX_PEAKS then
    since = list[1][1]
    table.remove(list, 1)
  end
  list[#list + 1] = {t, level, mixed}
  return since
end

-- peaks_highest returns the highest level the bucket held since a charge of charge (scaled) at
-- at, now holding now; nil when the record does not reach back to at (peaks.highest).
local function peaks_highest(list, since, at, charge, now)
  if at <= since then
    return nil
  end
  local m = now
  for i = 1, #list do
    local e = list[i]
    if e[1] == at and not e[3] then
      m = math.max(m, e[2] - charge)
    elseif e[1] >= at then
      return math.max(m, e[2])
    end
  end
  return m
end

-- peaks_lift raises the levels recorded after a charge at at by give, at most to cap, and
-- returns the list without the levels no higher than a later one, the level recorded at now,
-- if any, marked mixed (peaks.lift).
local function peaks_lift(list, at, give, cap, now)
  if give <= 0 then
    return list
  end
  for i = 1, #list do
    local e = list[i]
    if e[1] > at or (e[1] == at and e[3]) then
      e[2] = math.min(cap, e[2] + give)
    end
  end
  local out, top = {}, -1
  for i = #list, 1, -1 do
    if list[i][2] > top then
      table.insert(out, 1, list[i])
      top = list[i][2]
    end
  end
  if #out > 0 and out[#out][1] == now then
    out[#out][3] = true
  end
  return out
end

-- store_peaks stores a token bucket with its record: tokens (0 in its place and the debt
-- after it when below 0), last, unit, debt, last - since, then each level's 2 * (last - at)
-- (+ 1 when it is mixed) and the level.
local function store_peaks(key, ttl, tokens, last, unit, since, list)
  local v = {math.max(tokens, 0), last, unit, math.max(-tokens, 0), last - since}
  for i = 1, #list do
    local e = list[i]
    local mixed = 0
    if e[3] then
      mixed = 1
    end
    v[#v + 1] = 2 * (last - e[1]) + mixed
    v[#v + 1] = e[2]
  end
  set_state(key, ttl, unpack(v))
end
