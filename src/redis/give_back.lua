-- Give a booking's capacity back, as the algorithms' refund and cancel do
-- (src/rate_limit/algorithm/*.rs), where that never lets a later booking
-- overtake an earlier one. A state kept under other parameters (a retune
-- came between) is left as it is: keeping the capacity spent is the safe
-- side.
--
-- KEYS         each quota's state, as for the admission
-- ARGV         mode (r: the outcome did not count; c: a waiter left before
--              its turn), cost, now (as for the admission), then per
--              quota: kind, a, b, mark

local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cancel = ARGV[1] == 'c'
local cost = tonumber(ARGV[2])

local k = 1
local i = 4
while ARGV[i] do
  local kind, a, b, mark = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local key = KEYS[k]
  k = k + 1
  if kind == 'g' then
    local v = redis.call('HMGET', key, 't', 'e', 'b')
    local tat = tonumber(v[1])
    if tat and tonumber(v[2]) == a and tonumber(v[3]) == b then
      if cancel then
        -- Only the last booking can be undone exactly.
        if tat == tonumber(mark) then
          redis.call('HSET', key, 't', tat - a * cost)
        end
      elseif tat > now and tat <= now + a * b then
        -- Beyond now + tolerance a request is booked for the future.
        redis.call('HSET', key, 't', math.max(tat - a * cost, now))
      end
    end
  elseif kind == 's' then
    local aux = KEYS[k]
    k = k + 1
    if redis.call('ZREM', key, mark) == 1 then
      redis.call('HINCRBY', aux, 's', -cost)
    end
  else
    -- f: the window's end; t: the turn's start.
    local field = 'e'
    local check = 'w'
    if kind == 't' then field = 's'; check = nil end
    local v = redis.call('HMGET', key, field, 'u', check or field)
    if tonumber(v[1]) == tonumber(mark) and (kind == 't' or tonumber(v[3]) == b) then
      redis.call('HSET', key, 'u', math.max((tonumber(v[2]) or 0) - cost, 0))
    end
  end
  i = i + 4
end
return 1
