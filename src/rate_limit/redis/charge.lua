-- Charge a booking's shortfall: the request cost more than it was charged
-- at admission (a settled estimate). Charged without refusal and without
-- moving any booking, as Meter::settle does in process: a token bucket
-- owes it after every booking (at most one burst), a window or a turn
-- counts it in the window or turn the request was counted in, a sliding
-- window's booking is written again at its real cost (at most the limit).
--
-- KEYS  each quota's state, as for the admission
-- ARGV  the shortfall, now (empty: Redis's TIME), the instant booked, then
--       per quota: kind (upper case: counting requests, left alone), a, b,
--       and what identifies the booking (as the admission returned it)

local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local extra = tonumber(ARGV[1])
local at = tonumber(ARGV[3])
local max, min, fmt = math.max, math.min, string.format

local k = 1
local i = 4
while ARGV[i] do
  local kind, a, b, mark = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local per_request = kind ~= string.lower(kind)
  kind = string.lower(kind)
  local key = KEYS[k]
  k = k + 1
  if not per_request then
    if kind == 'g' then
      local v = redis.call('GET', key)
      local tat, e, bb
      if v then tat, e, bb = string.match(v, '^([^,]+),([^,]+),([^,]+)$') end
      -- A state kept under other parameters (a retune came between) is
      -- left as it is; a key gone idle owes from now.
      if not v or (tonumber(e) == a and tonumber(bb) == b) then
        -- And one burst of debt in all, as Gcra::settle: several charges
        -- add up to no more than an empty bucket and a burst.
        local from = max(tonumber(tat) or 0, now)
        local new = min(from + min(a * extra, a * b), max(from, now + 2 * a * b))
        redis.call('SET', key, fmt('%d,%d,%d', new, a, b),
          'PX', max(math.ceil((new - now) / 1000), 0) + 1000)
      end
    elseif kind == 'f' then
      local v = redis.call('GET', key)
      local e, u, w, l
      if v then e, u, w, l = string.match(v, '^([^,]+),([^,]+),([^,]+),([^,]+)$') end
      if v and tonumber(e) == tonumber(mark) and tonumber(w) == b then
        redis.call('SET', key, fmt('%d,%d,%s,%s', tonumber(e), (tonumber(u) or 0) + extra, w, l), 'KEEPTTL')
      end
    elseif kind == 'a' then
      -- In the count of the window it was counted in, as a refund.
      local v = redis.call('GET', key)
      local e, p, u, l, w, n
      if v then e, p, u, l, w, n = string.match(v, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$') end
      e, p, u, w = tonumber(e), tonumber(p), tonumber(u), tonumber(w)
      if e and p and u and w == b then
        -- Counts as in process: at most 2^32 - 1.
        if e == tonumber(mark) then
          u = min(u + extra, 4294967295)
        elseif e == tonumber(mark) + w then
          p = min(p + extra, 4294967295)
        end
        redis.call('SET', key, fmt('%d,%d,%d,%s,%d,%s', e, p, u, l, w, n), 'KEEPTTL')
      end
    elseif kind == 't' then
      local v = redis.call('GET', key)
      local s, u, x
      if v then s, u, x = string.match(v, '^([^,]+),([^,]+),([^,]+)$') end
      if v and tonumber(s) == tonumber(mark) then
        redis.call('SET', key, fmt('%d,%d,%s', tonumber(s), tonumber(u) + extra, x), 'KEEPTTL')
      end
    else
      local seq, c = string.match(mark, '^(%d+):(%d+)$')
      c = tonumber(c)
      if seq and tonumber(redis.call('ZSCORE', key, mark)) == at then
        local new = min(c + extra, a)
        -- The window's figures (see admit.lua): a set without them is
        -- counted again at its next admission.
        local sum = redis.call('ZSCORE', key, '#s')
        if new > c and sum then
          -- Its sum, at score -1 - sum, grows with the booking.
          redis.call('ZADD', key, at, seq .. ':' .. new, tonumber(sum) - (new - c), '#s')
          redis.call('ZREM', key, mark)
        end
      end
    end
  end
  i = i + 4
end
return 1
