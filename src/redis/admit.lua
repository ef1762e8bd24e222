-- Judge every quota of one key at once, and book them all or none.
--
-- The arithmetic is that of src/rate_limit/algorithm/*.rs, in microseconds
-- of Redis's own clock (TIME): Lua numbers are doubles, exact to 2^53, which
-- microseconds since the epoch stay well under; nanoseconds would not.
--
-- KEYS[1]      the key's rule marker (which rule it last spent under)
-- KEYS[2..]    each quota's state; a sliding window has two keys (its
--              bookings and its sum), the others one
-- ARGV         cost, max_wait, horizon, info (0/1), waits (0/1), rule,
--              marker_ttl (ms), now (empty: Redis's TIME; a number: a
--              clock a test sets), then per quota: kind (g, s, f, t), a, b
--                g: emission, burst      s: limit, window
--                f: limit, window        t: limit, stale_after
--
-- Returns {0, wait, slowest} when refused (nothing booked), else
-- {1, at, now, left, reset, tightest, mark...}: the instant booked, Redis's
-- now, what remains of the tightest quota (when info), and per quota what
-- identifies its booking (to give it back).

local now = tonumber(ARGV[8])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local info = ARGV[4] == '1'
local waits = ARGV[5] == '1'
local rule = ARGV[6]
local marker_ttl = tonumber(ARGV[7])
-- Past the moment a state goes idle, so that it never expires early.
local SLACK = 1000

local function ttl_ms(idle_at)
  local ms = math.ceil((idle_at - now) / 1000) + SLACK
  if ms < SLACK then ms = SLACK end
  return ms
end

-- Token bucket (GCRA): the theoretical arrival time, and the parameters it
-- was kept under, so that a retune converts it as Gcra::retune does.
local G = {}
function G.load(q)
  local v = redis.call('HMGET', q.key, 't', 'e', 'b')
  q.fresh = not v[1]
  q.tat = tonumber(v[1]) or 0
  q.tol = q.a * q.b
  local oe, ob = tonumber(v[2]), tonumber(v[3])
  if oe and ob and (oe ~= q.a or ob ~= q.b) and q.tat > now then
    local last = q.tat - math.min(oe * ob, q.tat)
    if last > now then
      q.tat = last + q.tol
    else
      local owed = math.ceil((q.tat - now) / math.max(oe, 1))
      local available = math.min(math.max(ob - owed, 0), q.b)
      q.tat = now + q.a * (q.b - available)
    end
  end
end
function G.fill(q, at)
  q.tat = math.max(q.tat, at + q.tol)
end
function G.earliest(q)
  if q.tat > now + q.tol + horizon then q.tat = 0 end
  return math.max(math.max(q.tat, now) + q.a * cost - q.tol, now)
end
function G.book(q, at)
  q.tat = math.max(q.tat, at, now) + q.a * cost
  return q.tat
end
function G.remaining(q, goes)
  local owed = math.max(q.tat - goes, 0)
  local free = math.floor(math.max(q.tol - owed, 0) / q.a)
  return math.min(free, q.b), owed
end
function G.save(q)
  redis.call('HSET', q.key, 't', q.tat, 'e', q.a, 'b', q.b)
  redis.call('PEXPIRE', q.key, ttl_ms(q.tat))
end

-- Fixed windows: the latest window with bookings (its end and its use),
-- boundaries at multiples of the window on Redis's clock.
local F = {}
local function end_of(q, at)
  return (math.floor(at / q.b) + 1) * q.b
end
function F.load(q)
  local v = redis.call('HMGET', q.key, 'e', 'u', 'w', 'l')
  q.fresh = not v[1]
  q.e = tonumber(v[1]) or 0
  q.u = tonumber(v[2]) or 0
  local ow, ol = tonumber(v[3]), tonumber(v[4])
  if ow and ol and ow ~= q.b and q.e > now then
    -- As FixedWindow::retune: count the bookings in the new window holding
    -- the latest instant they can have, plus every earlier old window that
    -- overlaps it at its full limit.
    local start = math.max(q.e - ow, 0)
    local latest = now
    if start > now then latest = q.e - 1 end
    local e = end_of(q, latest)
    local earlier = math.ceil(math.max(start - math.max(e - q.b, 0), 0) / ow)
    q.e = e
    q.u = q.u + ol * earlier
  end
end
function F.fill(q, at)
  local e = end_of(q, at)
  if e > q.e then
    q.e = e
    q.u = q.a
  elseif e == q.e then
    q.u = math.max(q.u, q.a)
  end
end
function F.earliest(q)
  if q.e > end_of(q, now + horizon) then q.e = 0; q.u = 0 end
  if q.e <= now then q.e = 0; q.u = 0; return now end
  if q.u + cost <= q.a then return math.max(q.e - q.b, now) end
  return q.e
end
function F.book(q, at)
  local e = end_of(q, at)
  if e == q.e then q.u = q.u + cost else q.e = e; q.u = cost end
  return e
end
function F.remaining(q, goes)
  if q.e <= goes then return q.a, 0 end
  local used = q.a
  if q.e == end_of(q, goes) then used = q.u end
  return math.max(q.a - used, 0), q.e - goes
end
function F.save(q)
  redis.call('HSET', q.key, 'e', q.e, 'u', q.u, 'w', q.b, 'l', q.a)
  redis.call('PEXPIRE', q.key, ttl_ms(q.e))
end

-- Exact sliding window: the bookings in a sorted set (score: instant;
-- member: a sequence number and the cost, so each is unique), and their
-- sum and the sequence in a hash.
local S = {}
local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$'))
end
local function latest(q)
  local last = redis.call('ZRANGE', q.key, -1, -1, 'WITHSCORES')
  return tonumber(last[2])
end
function S.load(q)
  q.last = latest(q)
  q.fresh = not q.last
  local v = redis.call('HMGET', q.aux, 's', 'n')
  q.sum = tonumber(v[1]) or 0
  q.seq = tonumber(v[2]) or 0
  if not q.last then q.sum = 0 end
end
function S.fill(q, at)
  -- A whole window's worth at `at`, after any later booking.
  local at = math.max(q.last or at, at)
  q.seq = q.seq + 1
  redis.call('ZADD', q.key, at, q.seq .. ':' .. q.a)
  q.sum = q.sum + q.a
  q.last = at
end
function S.earliest(q)
  if q.last and q.last > now + horizon then
    redis.call('DEL', q.key)
    q.last = nil
    q.sum = 0
  end
  -- A booking exactly a window old has expired.
  local gone = redis.call('ZRANGEBYSCORE', q.key, '-inf', now - q.b)
  if #gone > 0 then
    for _, member in ipairs(gone) do q.sum = q.sum - cost_of(member) end
    redis.call('ZREMRANGEBYSCORE', q.key, '-inf', now - q.b)
  end
  local at = math.max(q.last or now, now)
  local alive = q.sum
  local room = math.max(q.a - cost, 0)
  -- Oldest first, bookings leave the window until this one fits; usually
  -- none or one has to.
  local from = 0
  while alive > room do
    local page = redis.call('ZRANGE', q.key, from, from + 31, 'WITHSCORES')
    if #page == 0 then break end
    for i = 1, #page, 2 do
      if alive <= room then break end
      at = math.max(at, tonumber(page[i + 1]) + q.b)
      alive = alive - cost_of(page[i])
    end
    from = from + 32
  end
  return at
end
function S.book(q, at)
  q.seq = q.seq + 1
  local member = q.seq .. ':' .. cost
  redis.call('ZADD', q.key, at, member)
  q.sum = q.sum + cost
  q.last = math.max(q.last or at, at)
  return member
end
function S.remaining(q, goes)
  local live = q.sum
  if goes > now then
    live = 0
    local alive = redis.call('ZRANGEBYSCORE', q.key, '(' .. (goes - q.b), '+inf')
    for _, member in ipairs(alive) do live = live + cost_of(member) end
  end
  return math.max(q.a - live, 0), math.max((q.last or 0) + q.b - goes, 0)
end
function S.save(q)
  redis.call('HSET', q.aux, 's', q.sum, 'n', q.seq)
  local ttl = ttl_ms((q.last or now) + q.b)
  redis.call('PEXPIRE', q.key, ttl)
  redis.call('PEXPIRE', q.aux, ttl)
end

-- Budget per turn: the turn's start, its use, and when it goes stale.
local T = {}
function T.load(q)
  local v = redis.call('HMGET', q.key, 's', 'u', 'x')
  q.fresh = not v[1]
  q.s = tonumber(v[1]) or 0
  q.u = tonumber(v[2]) or 0
  q.x = tonumber(v[3]) or 0
end
local function turn_idle(q, at)
  return q.u == 0 or q.x <= at
end
function T.fill(q, at)
  if turn_idle(q, at) then
    q.s = at; q.u = q.a; q.x = at + q.b
  else
    q.u = math.max(q.u, q.a)
  end
end
function T.earliest(q)
  if turn_idle(q, now) or q.s > now + horizon then
    q.s = 0; q.u = 0; q.x = 0
    return now
  end
  if q.u + cost <= q.a then return math.max(now, q.s) end
  return q.x
end
function T.book(q, at)
  if q.u == 0 or at >= q.x then
    q.s = at; q.u = cost; q.x = at + q.b
  else
    q.u = q.u + cost
  end
  return q.s
end
function T.remaining(q, goes)
  if turn_idle(q, goes) then return q.a, 0 end
  return math.max(q.a - q.u, 0), q.x - goes
end
function T.save(q)
  redis.call('HSET', q.key, 's', q.s, 'u', q.u, 'x', q.x)
  redis.call('PEXPIRE', q.key, ttl_ms(q.x))
end

local KINDS = { g = G, s = S, f = F, t = T }

-- Read every quota.
local quotas = {}
local k = 2
local i = 9
while ARGV[i] do
  local q = { kind = KINDS[ARGV[i]], a = tonumber(ARGV[i + 1]), b = tonumber(ARGV[i + 2]) }
  q.key = KEYS[k]
  k = k + 1
  if ARGV[i] == 's' then
    q.aux = KEYS[k]
    k = k + 1
  end
  q.kind.load(q)
  quotas[#quotas + 1] = q
  i = i + 3
end

-- A key that spent under another rule (as far as its marker remembers)
-- starts each quota it has no state in spent, never with a free burst.
local was = redis.call('GET', KEYS[1])
if was and was ~= rule then
  for _, q in ipairs(quotas) do
    if q.fresh then q.kind.fill(q, now) end
  end
end

-- The earliest instant every quota admits.
local at = now
local slowest = 0
for n, q in ipairs(quotas) do
  local earliest = q.kind.earliest(q)
  if earliest > at then
    at = earliest
    slowest = n - 1
  end
end
if at - now > max_wait then
  -- Nothing booked. A sliding window's expired bookings were dropped: its
  -- sum goes with them. (Other states are only read; a retune's conversion
  -- is made again, later, the same way.)
  for _, q in ipairs(quotas) do
    if q.kind == S then S.save(q) end
  end
  return { 0, at - now, slowest }
end

local marks = {}
for n, q in ipairs(quotas) do
  marks[n] = q.kind.book(q, at)
end
local left, reset, tightest = 0, 0, 0
if info then
  -- As of the instant the request goes: now, unless it waits.
  local goes = now
  if waits then goes = at end
  left = -1
  for n, q in ipairs(quotas) do
    local l, r = q.kind.remaining(q, goes)
    if left < 0 or l < left or (l == left and r > reset) then
      left, reset, tightest = l, r, n - 1
    end
  end
end
for _, q in ipairs(quotas) do
  q.kind.save(q)
end
redis.call('SET', KEYS[1], rule, 'PX', marker_ttl)

local reply = { 1, at, now, left, reset, tightest }
for n = 1, #marks do
  reply[#reply + 1] = marks[n]
end
return reply
