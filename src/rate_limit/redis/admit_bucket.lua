-- admit.lua for its commonest call, one token bucket with no rules and no
-- quota it replaced (rate_limit/redis/mod.rs sends this one only those): the same keys,
-- arguments, state and reply, the same arithmetic, and nothing else, so
-- that it costs Redis what any GCRA must (TIME, GET, SET PX) and little
-- more. Kept beside admit.lua's token bucket: a change to one is a change
-- to both (tests/redis_rate_limit.rs runs every case through each).
--
-- KEYS[2]   the quota's state, "tat,e,b" (KEYS[1], the rule marker, is
--           unused without rules)
-- ARGV      as admit.lua's: cost, max_wait, horizon, info, waits, rule
--           (empty), marker_ttl, now (empty: Redis's TIME), probe (0),
--           then the quota: kind (g; G counts one per request), emission,
--           burst, and '-' (none replaced)

local now = tonumber(ARGV[8])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max, min = math.max, math.min
local c = tonumber(ARGV[1])
if ARGV[10] == 'G' then c = 1 end
local a, b = tonumber(ARGV[11]), tonumber(ARGV[12])
local tol = a * b
local key = KEYS[2]
local tat = 0
local converted = false
local v = redis.call('GET', key)
if v then
  local t, oe, ob = string.match(v, '^([^,]+),([^,]+),([^,]+)$')
  tat = tonumber(t) or 0
  oe, ob = tonumber(oe), tonumber(ob)
  if oe and ob and (oe ~= a or ob ~= b) and tat > now then
    -- Retuned, as admit.lua converts it.
    local last = tat - min(oe * ob, tat)
    if last > now then
      tat = last + tol
    else
      local owed = math.ceil((tat - now) / max(oe, 1))
      local available = min(max(ob - owed, 0), b)
      tat = now + a * (b - available)
    end
    converted = true
  end
end
if tat > now + 2 * tol + tonumber(ARGV[3]) then tat = 0 end
local at = max(max(tat, now) + a * c - tol, now)
if at - now > tonumber(ARGV[2]) then
  if converted then
    redis.call('SET', key, string.format('%d,%d,%d', tat, a, b),
      'PX', max(math.ceil((tat - now) / 1000), 0) + 1000)
  end
  return { 0, at - now, 0 }
end
tat = max(tat, at, now) + a * c
local reply = { 1, at, now, 0, 0, 0, tat }
if ARGV[4] == '1' then
  local goes = now
  if ARGV[5] == '1' then goes = at end
  local owed = max(tat - goes, 0)
  reply[4] = min(math.floor(max(tol - owed, 0) / a), b)
  reply[5] = owed
end
redis.call('SET', key, string.format('%d,%d,%d', tat, a, b),
  'PX', max(math.ceil((tat - now) / 1000), 0) + 1000)
return reply
