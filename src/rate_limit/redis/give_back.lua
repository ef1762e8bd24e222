-- Give a booking's capacity back, as the algorithms' refund and cancel do
-- (src/rate_limit/algorithm/*.rs), where that never lets a later booking
-- overtake an earlier one. A state kept under other parameters (a retune
-- came between) is left as it is: keeping the capacity spent is the safe
-- side. States are as admit.lua keeps them; their TTLs are kept (a
-- sliding window's set keeps its figures, so it never goes away here).
--
-- KEYS         each quota's state, as for the admission
-- ARGV         mode (r: the outcome did not count; c: a waiter left before
--              its turn; x followed by the whole charge, as `x600`: the
--              request cost less than it was charged, and `cost` is the
--              excess), cost, now (as for the admission), the
--              instant booked, then per quota: kind (upper case: counting
--              one per request, which an excess leaves alone), a, b, mark

local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cancel = ARGV[1] == 'c'
local excess = string.sub(ARGV[1], 1, 1) == 'x'
local charged = tonumber(ARGV[2])
-- The whole booking, of which an excess is the end.
local whole = tonumber(string.sub(ARGV[1], 2)) or charged
local at = tonumber(ARGV[4])
local max, min, fmt = math.max, math.min, string.format

-- A sliding window's figures, kept in its set before the bookings at
-- score -1 - value (see admit.lua): sum, count, latest booking.
local function read_meta(key)
  local m = {}
  local got = redis.call('ZRANGE', key, 0, 4, 'WITHSCORES')
  for j = 1, #got, 2 do
    if string.sub(got[j], 1, 1) == '#' then m[got[j]] = -1 - tonumber(got[j + 1]) end
  end
  return m['#s'], m['#c'], m['#l']
end

local k = 1
local i = 5
while ARGV[i] do
  local kind, a, b, mark = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local cost = charged
  if kind ~= string.lower(kind) then
    kind = string.lower(kind)
    cost = 1
    if excess then cost = 0 end
  end
  local key = KEYS[k]
  k = k + 1
  if cost == 0 then
    -- Nothing to give back to this quota.
  elseif kind == 's' then
    -- The booking itself, not one a state made afresh (after a reset,
    -- or once idle) numbered the same; and the window's figures, which
    -- a set without them (no script of ours leaves one) has counted
    -- again at its next admission.
    local sum, count, latest = read_meta(key)
    if sum and count and latest and tonumber(redis.call('ZSCORE', key, mark)) == at then
      local seq = string.match(mark, '^(%d+):')
      if excess and seq and whole > cost then
        -- The booking stays, at its instant, for what it really cost:
        -- the member is written again with the smaller cost (its sequence
        -- number keeps it unique), as Meter::settle does in process.
        redis.call('ZADD', key, at, seq .. ':' .. (whole - cost), -1 - (sum - cost), '#s')
        redis.call('ZREM', key, mark)
      else
        redis.call('ZREM', key, mark)
        if at == latest then
          -- A later booking goes no earlier than the latest one left.
          local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', 0, 'WITHSCORES', 'LIMIT', 0, 1)
          latest = tonumber(newest[2]) or 0
        end
        redis.call('ZADD', key, -1 - max(sum - cost, 0), '#s', -1 - max(count - 1, 0), '#c',
          -1 - latest, '#l')
      end
    end
  else
    local v = redis.call('GET', key)
    if kind == 'g' and v then
      local tat, e, bb = string.match(v, '^([^,]+),([^,]+),([^,]+)$')
      tat = tonumber(tat)
      if tat and tonumber(e) == a and tonumber(bb) == b then
        local new = nil
        if cancel then
          -- Only the last booking can be undone exactly.
          if tat == tonumber(mark) then new = tat - a * cost end
        elseif tat > now and tat <= now + a * b then
          -- Beyond now + tolerance a request is booked for the future.
          -- What of the booking has not come back by itself since its
          -- instant: a unit the bucket refilled long ago is not given back
          -- again, on top of the requests admitted since.
          -- An excess is the end of its booking: counted from the whole.
          local booked = cost
          if excess then booked = whole end
          local owed = min(at + a * booked - now, a * cost)
          if owed > 0 then new = max(tat - owed, now) end
        end
        if new then
          redis.call('SET', key, fmt('%d,%d,%d', new, a, b), 'KEEPTTL')
        end
      end
    elseif kind == 'f' and v then
      -- The window's end marks the booking.
      local e, u, w, l = string.match(v, '^([^,]+),([^,]+),([^,]+),([^,]+)$')
      if tonumber(e) == tonumber(mark) and tonumber(w) == b then
        local used = max((tonumber(u) or 0) - cost, 0)
        redis.call('SET', key, fmt('%d,%d,%s,%s', tonumber(e), used, w, l), 'KEEPTTL')
      end
    elseif kind == 'a' and v then
      -- The window's end marks the booking; it counts in that window's
      -- count, which is the previous one's once a window has passed (its
      -- remaining weight is what comes back). Newcomers still go after
      -- the latest booking, kept.
      local e, p, u, l, w, n = string.match(v, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
      e, p, u, w = tonumber(e), tonumber(p), tonumber(u), tonumber(w)
      if e and p and u and w == b then
        if e == tonumber(mark) then
          u = max(u - cost, 0)
        elseif e == tonumber(mark) + w then
          p = max(p - cost, 0)
        end
        redis.call('SET', key, fmt('%d,%d,%d,%s,%d,%s', e, p, u, l, w, n), 'KEEPTTL')
      end
    elseif kind == 't' and v then
      -- The turn's start marks the booking.
      local s, u, x = string.match(v, '^([^,]+),([^,]+),([^,]+)$')
      if tonumber(s) == tonumber(mark) then
        local used = max((tonumber(u) or 0) - cost, 0)
        redis.call('SET', key, fmt('%d,%d,%s', tonumber(s), used, x), 'KEEPTTL')
      end
    end
  end
  i = i + 4
end
return 1
