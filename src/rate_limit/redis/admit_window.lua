-- admit.lua for one sliding window counting requests, with no rules and no
-- quota it replaced (rate_limit/redis/mod.rs sends this one only those):
-- the same keys, arguments, state and reply, the same arithmetic, without
-- the loops over quotas, rules and conversions, which cost Redis more than
-- the window's own commands. Kept beside admit.lua's sliding window: a
-- change to one is a change to both (tests/redis_model.rs runs histories
-- through each).
--
-- A state this script does not keep itself answers {2} and is left as it
-- is, and the whole admit.lua runs instead: a set without its figures (no
-- script of ours leaves one), or one holding more than one booking of
-- several units (what a key took over under rules).
--
-- KEYS[2]   the window's sorted set (KEYS[1], the rule marker, is unused
--           without rules)
-- ARGV      as admit.lua's: cost, max_wait, horizon, info, waits, rule
--           (empty), marker_ttl, now (empty: Redis's TIME), probe (0),
--           then the quota: S, limit, window, and '-' (none replaced)

local now = tonumber(ARGV[8])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max, min, ceil = math.max, math.min, math.ceil
local horizon = tonumber(ARGV[3])
local a, b = tonumber(ARGV[11]), tonumber(ARGV[12])
local key = KEYS[2]
-- The most expired bookings a call removes (as admit.lua).
local TRIM = 64

-- The figures, at negative scores before the bookings (see admit.lua).
local got = redis.call('ZRANGE', key, 0, 4, 'WITHSCORES')
local m, base = {}, 0
for j = 1, #got, 2 do
  if string.sub(got[j], 1, 1) == '#' then
    m[got[j]] = -1 - tonumber(got[j + 1])
    base = base + 1
  end
end
local sum, seq, card, last, ttl = m['#s'], m['#n'], m['#c'], m['#l'], m['#x']
if #got == 0 then
  -- No set: a fresh key.
  sum, seq, card, last, ttl = 0, 0, 0, nil, 0
elseif not (sum and seq and card and last and ttl) then
  return { 2 }
end
if last and last > now + horizon then
  -- So far ahead no clock running forwards leaves it: start afresh.
  redis.call('UNLINK', key)
  last, sum, card, ttl = nil, 0, 0, 0
end
local earliest = max(last or now, now)
local room = max(a - 1, 0)
-- A booking exactly a window old has expired.
local cut = now - b
-- Every booking counts one but perhaps the oldest (see admit.lua).
local heavy, heavy_at = 0, 0
if sum ~= card then
  if card == 0 then return { 2 } end
  local oldest = redis.call('ZRANGE', key, base, base, 'WITHSCORES')
  local c0 = oldest[1] and tonumber(string.match(oldest[1], ':(%d+)$'))
  if not (c0 and sum - card == c0 - 1) then return { 2 } end
  heavy, heavy_at = c0 - 1, tonumber(oldest[2])
end
local gone = 0
if card > 0 then gone = redis.call('ZCOUNT', key, 0, cut) end
local extra = 0
if heavy > 0 and heavy_at <= cut then extra = heavy end
local trimmed = false
if gone > 0 then
  local n = min(gone, TRIM)
  redis.call('ZREMRANGEBYRANK', key, base, base + n - 1)
  sum = sum - n - extra
  card = card - n
  trimmed = true
  heavy = heavy - extra
  gone = gone - n
end
-- What has to leave, oldest first: the heavy one (when live) takes
-- 1 + heavy at once.
local over = sum - gone - room
if over > 0 then
  local k = over
  if heavy > 0 then k = max(over - heavy, 1) end
  local r = base + gone + k - 1
  local page = redis.call('ZRANGE', key, r, r, 'WITHSCORES')
  if page[2] then earliest = max(earliest, tonumber(page[2]) + b) end
end

local at = earliest
if at - now > tonumber(ARGV[2]) then
  -- Refused: nothing booked; only what the expired took away is written.
  if trimmed then
    redis.call('ZADD', key, -1 - sum, '#s', -1 - card, '#c')
  end
  return { 0, at - now, 0 }
end

seq = seq + 1
local member = string.format('%016d:1', seq)
sum = sum + 1
card = card + 1
last = max(last or at, at)
local reply = { 1, at, now, 0, 0, 0, member }
if ARGV[4] == '1' then
  -- What remains, as of the instant the request goes: now, unless it
  -- waits. The booking just made is in the sum, not yet in the set.
  local goes = now
  if ARGV[5] == '1' then goes = at end
  local live = sum - gone
  if goes > now then
    live = sum - redis.call('ZCOUNT', key, 0, string.format('%d', goes - b))
    if heavy > 0 and heavy_at <= goes - b then live = live - heavy end
  end
  reply[4] = max(a - live, 0)
  reply[5] = max(last + b - goes, 0)
end

-- The TTL, a second past the latest booking's expiry, set a second further
-- still, so that a busy key sets it about once a second.
local needed = now + (max(ceil((last + b - now) / 1000), 0) + 1000) * 1000
local set_ttl = ttl < needed
if set_ttl then ttl = needed + 1000000 end
redis.call('ZADD', key, -1 - sum, '#s', -1 - seq, '#n', -1 - card, '#c',
  -1 - last, '#l', -1 - ttl, '#x', at, member)
if set_ttl then redis.call('PEXPIRE', key, ceil((ttl - now) / 1000)) end
return reply
