-- Judge every quota of one key at once, and book them all or none.
--
-- The arithmetic is that of src/rate_limit/algorithm/*.rs, in microseconds
-- of Redis's own clock (TIME): Lua numbers are doubles, exact to 2^53, which
-- microseconds since the epoch stay well under; nanoseconds would not.
--
-- Written as plain branches on each quota's kind, with no function made
-- inside: the whole script runs on every call, and closures over its
-- locals cost Redis about 3 µs per algorithm per call (measured), more than
-- the commands themselves.
--
-- KEYS[1]      the key's rule marker (which rule it last spent under),
--              used only when the limiter has rules
-- KEYS[2..]    each quota's state, one key each
-- KEYS[next]   with a probe (ARGV[9]): the default rule's first state, to
--              tell whether a key never seen under a rule spent under the
--              default before the rules came
-- KEYS[rest]   the states of the quotas of another algorithm that quotas
--              replaced in a retune, in order
-- ARGV         cost, max_wait, horizon, info (0/1), waits (0/1), rule
--              (empty: no rules), marker_ttl (ms), now (empty: Redis's
--              TIME; a number: a clock a test sets), probe (0/1), then per
--              quota: kind (g, s, f, t, a; upper case: counting one per
--              request, whatever the cost), a, b, then the kind, a and b of
--              the quota of another algorithm it replaced ('-': none)
--                g: emission, burst      s: limit, window
--                f: limit, window        t: limit, stale_after
--                a: limit, window
--
-- Per quota, the state (and its TTL, a second past the moment it goes
-- idle), in strings where it can be, which Redis reads and writes with one
-- command each (GET, SET PX):
--   g  "tat,e,b": the theoretical arrival time, and the parameters it was
--      kept under, so that a retune converts it as Gcra::retune does
--   f  "e,u,w,l;t": the end of the latest window with bookings, its use,
--      the window and limit it was kept under, and the latest instant
--      booked in it (a retune to another window counts its bookings in the
--      new window holding that instant; a state without it, as scripts
--      before it wrote, is converted as they did, which its readers there
--      keep reading: `l;t` is not a number to them, so they do not convert)
--   s  one sorted set: the bookings (score: instant; member: a sequence
--      number and the cost, so each is unique) and, before them at
--      negative scores (-1 - value), the window's figures: #s (the
--      bookings' sum), #n (the sequence), #c (how many), #l (the latest
--      booking's instant), #x (until when the set's TTL holds). One key:
--      read with one command, written with the booking's own ZADD, and
--      evicted, if ever, whole.
--   t  "s,u,x": the turn's start, its use, and when it goes stale
--   a  "e,p,u,l,w,n": a sliding window counter's window end, the
--      previous window's count and this one's, the latest instant booked,
--      and the window and limit it was kept under
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
local rule = ARGV[6]
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
-- The most expired bookings a call removes.
local TRIM = 64
-- A booking's member: its number, zero-padded so that bookings at one
-- instant sort in the order they were made, and its cost.
local function fmt_member(seq, c)
  return string.format('%016d:%d', seq, c)
end
local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$'))
end
-- floor(x * y / d) and its remainder (a sliding window counter's sums),
-- made when a counter is among the quotas (below): a function made on
-- every call costs Redis about half a microsecond.
local mul_div
-- How many figures a sliding window's set holds before its bookings.
local META = 5
-- A sliding window's figures: sum, sequence, count, latest, TTL until
-- (nil when its set has none), and how many it has.
local function read_meta(key)
  local m, n = {}, 0
  local got = redis.call('ZRANGE', key, 0, META - 1, 'WITHSCORES')
  for j = 1, #got, 2 do
    if string.sub(got[j], 1, 1) == '#' then
      m[got[j]] = -1 - tonumber(got[j + 1])
      n = n + 1
    end
  end
  return m['#s'], m['#n'], m['#c'], m['#l'], m['#x'], n
end
-- The units of the bookings in sorted set `key` that live past `edge`
-- (score above it), read from the newest end, stopping once `enough` are
-- counted: never more than that many bookings are read, whatever waiters
-- ahead or expired bookings the set holds.
local function live_from_newest(key, edge, enough)
  local acc, from = 0, 0
  while acc < enough do
    local page = redis.call('ZREVRANGE', key, from, from + 31, 'WITHSCORES')
    if #page == 0 then break end
    for j = 1, #page, 2 do
      -- The figures, at negative scores, end the bookings.
      local booked = tonumber(page[j + 1])
      if booked <= edge or booked < 0 or acc >= enough then return acc end
      acc = acc + cost_of(page[j])
    end
    from = from + 32
  end
  return acc
end

-- Read every quota.
local quotas = {}
local k = 2
local i = 10
while ARGV[i] do
  local kind = ARGV[i]
  -- An upper-case kind counts one per request, whatever the cost.
  local c = cost
  local per_request = kind ~= string.lower(kind)
  if per_request then kind = string.lower(kind); c = 1 end
  local q = { kind = kind, c = c, per_request = per_request, a = tonumber(ARGV[i + 1]), b = tonumber(ARGV[i + 2]), key = KEYS[k],
    pk = ARGV[i + 3], pa = tonumber(ARGV[i + 4]), pb = tonumber(ARGV[i + 5]) }
  k = k + 1
  -- See `mul_div` above.
  if not mul_div and (kind == 'a' or q.pk == 'a') then
    -- Exact for whole x < 2^32, y < 2^48 and 0 < d <= 2^45 - 2^32, where
    -- x * y can pass 2^53 (a limit times a window in microseconds): the
    -- long division of y in bytes keeps every step under 2^53. Counts
    -- stay under 2^32 and windows under 400 days (MAX_PERIOD, 3.5e13
    -- µs), inside those bounds. A double's quotient is corrected by its
    -- remainder, as it can round up.
    local function div_floor(n, d)
      local q = floor(n / d)
      local r = n - q * d
      if r < 0 then return q - 1 elseif r >= d then return q + 1 end
      return q
    end
    mul_div = function(x, y, d)
      if x * y < 9007199254740992 then
        local q = div_floor(x * y, d)
        return q, x * y - q * d
      end
      local q, r = 0, 0
      for shift = 40, 0, -8 do
        local acc = r * 256 + x * (floor(y / 2 ^ shift) % 256)
        local digit = div_floor(acc, d)
        r = acc - digit * d
        q = q * 256 + digit
      end
      return q, r
    end
  end
  if kind == 'g' then
    local v = redis.call('GET', q.key)
    q.fresh = not v
    local tat, oe, ob
    if v then tat, oe, ob = string.match(v, '^([^,]+),([^,]+),([^,]+)$') end
    q.tat = tonumber(tat) or 0
    q.tol = q.a * q.b
    oe, ob = tonumber(oe), tonumber(ob)
    if oe and ob and (oe ~= q.a or ob ~= q.b) and q.tat > now then
      -- Retuned: waiters keep their instants; with none, what was owed
      -- under the old rate stays owed, and the new burst never adds.
      local last = q.tat - min(oe * ob, q.tat)
      if last > now then
        q.tat = last + q.tol
      else
        local owed = ceil((q.tat - now) / max(oe, 1))
        local available = min(max(ob - owed, 0), q.b)
        q.tat = now + q.a * (q.b - available)
      end
      q.converted = true
    end
  elseif kind == 'f' then
    local v = redis.call('GET', q.key)
    q.fresh = not v
    local e, u, ow, ol, t
    if v then e, u, ow, ol = string.match(v, '^([^,]+),([^,]+),([^,]+),([^,]+)$') end
    if ol then
      local limit, latest = string.match(ol, '^([^;]+);(%d+)$')
      if limit then ol, t = limit, latest end
    end
    q.e = tonumber(e) or 0
    q.u = tonumber(u) or 0
    -- A booking lies in its window; anything else no script wrote.
    q.t = tonumber(t)
    if q.t and q.t >= q.e then q.t = nil end
    ow, ol = tonumber(ow), tonumber(ol)
    if not q.t and ow and ow > 0 and q.e - ow > now then
      -- Written without it (by a script before it) and booked ahead: its
      -- bookings are waiters, none later than a wait reaches. Kept as the
      -- window's latest, so that a booking added here cannot hide them.
      q.t = min(q.e - 1, now + horizon)
    end
    if ow and ol and ow > 0 and ow ~= q.b and q.e > now then
      -- New boundaries: count the bookings in the new window holding the
      -- latest instant they can have (none goes after the window's latest
      -- booking; one behind another quota's wait can lie ahead of now in
      -- the window holding now), plus every earlier old window that
      -- overlaps it at its full limit. Never past the horizon: counted at
      -- a long old window's end, the count would lie beyond it, and the
      -- check below would take it for a clock that ran backwards and start
      -- the key afresh (as FixedWindow::retune).
      local start = max(q.e - ow, 0)
      local latest = min(q.e - 1, now + horizon, max(start, now, q.t or 0))
      local e = (floor(latest / q.b) + 1) * q.b
      -- Counts as in process: at most 2^32 - 1.
      q.u = min(q.u + ol * ceil(max(start - max(e - q.b, 0), 0) / ow), 4294967295)
      q.e = e
      q.t = latest
      q.converted = true
    end
  elseif kind == 's' then
    q.sum, q.seq, q.card, q.last, q.ttl, q.base = read_meta(q.key)
    -- q.base: the rank of the oldest booking, past the figures.
    if not (q.sum and q.seq and q.card and q.last and q.ttl) then
      -- No figures: a fresh key, or bookings without them (no script of
      -- ours leaves that): counted again from the bookings, and written
      -- back. A window counting requests holds ones, but for the oldest
      -- two at most (what a key took over, and a whole window when it
      -- moved between rules, both made with its state); another is read
      -- whole, which its limit bounds (rate_limit/redis/mod.rs). Numbering starts afresh
      -- at now (µs), past every number a key ever had.
      q.sum, q.seq, q.card, q.ttl, q.last = 0, 0, 0, 0, nil
      local newest = redis.call('ZREVRANGEBYSCORE', q.key, '+inf', 0, 'WITHSCORES', 'LIMIT', 0, 1)
      if newest[2] then
        q.last = tonumber(newest[2])
        q.card = redis.call('ZCOUNT', q.key, 0, '+inf')
        local read = redis.call('ZRANGEBYSCORE', q.key, 0, '+inf', 'LIMIT', 0, 2)
        if not q.per_request then read = redis.call('ZRANGEBYSCORE', q.key, 0, '+inf') end
        q.sum = q.card
        for _, member in ipairs(read) do
          q.sum = q.sum + cost_of(member) - 1
        end
        q.seq = now
        q.converted = true
      end
    end
    q.fresh = not q.last
  elseif kind == 'a' then
    local v = redis.call('GET', q.key)
    q.fresh = not v
    local e, p, u, l, ow, ol
    if v then
      -- Only what a script of ours writes, whole numbers: anything else
      -- (a state no script left) is taken as none.
      e, p, u, l, ow, ol = string.match(v, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
    end
    q.e = tonumber(e) or 0
    q.p = tonumber(p) or 0
    q.u = tonumber(u) or 0
    q.l = tonumber(l) or 0
    ow, ol = tonumber(ow), tonumber(ol)
    if not (ow and ow > 0) then q.e = 0; q.p = 0; q.u = 0; q.l = 0; ow = nil end
    if ow and ol and ow ~= q.b and q.e + ow > now then
      -- New boundaries, as SlidingCounter::retune: the new window holding
      -- the latest instant booked (or now), and the one before it, take
      -- what the old windows overlapping them counted (the two known, and
      -- every older one at its whole limit); the first at least the old
      -- count then. A retune is rare: a function here costs nothing else.
      local function counted(from, to)
        local sum = 0
        if q.e > from and q.e - ow < to then sum = sum + q.u end
        if q.e - ow > from and q.e - 2 * ow < to then sum = sum + q.p end
        if q.e > from then
          local last = ceil((q.e - from) / ow) - 1
          local first = max(floor(max(q.e - to, 0) / ow), 2)
          if last >= first then sum = sum + ol * (last - first + 1) end
        end
        return sum
      end
      local t0 = max(now, q.l)
      local e2 = (floor(t0 / q.b) + 1) * q.b
      local s2 = max(e2 - q.b, 0)
      -- The old count at t0.
      local oe, op, ou = q.e, q.p, q.u
      local en = (floor(t0 / ow) + 1) * ow
      if oe < en then
        if oe + ow == en then op = ou else op = 0 end
        ou = 0; oe = en
      end
      local weighed, rest = mul_div(op, oe - t0, ow)
      if rest > 0 then weighed = weighed + 1 end
      local current = max(counted(s2, e2), weighed + ou)
      -- Counts as in process: at most 2^32 - 1.
      q.p = min(counted(max(s2 - q.b, 0), s2), 4294967295)
      q.u = min(current, 4294967295)
      q.e = e2
      q.converted = true
    end
  else
    local v = redis.call('GET', q.key)
    q.fresh = not v
    local st, u, x
    if v then st, u, x = string.match(v, '^([^,]+),([^,]+),([^,]+)$') end
    q.s = tonumber(st) or 0
    q.u = tonumber(u) or 0
    q.x = tonumber(x) or 0
  end
  quotas[#quotas + 1] = q
  i = i + 6
end
local probe = nil
if ARGV[9] == '1' then
  probe = KEYS[k]
  k = k + 1
end
for _, q in ipairs(quotas) do
  if q.pk ~= '-' then
    q.pkey = KEYS[k]
    k = k + 1
  end
end

-- A quota that replaced one of another algorithm, with no state of its own
-- yet: what the key has in use under the old one (as that algorithm
-- counts it, now) is taken here now, once (the old state goes), as
-- Table::carry_from does in process. A reload never hands out a quota.
for _, q in ipairs(quotas) do
  if q.pkey and q.fresh then
    local used = 0
    local pk = q.pk
    if pk == 'g' then
      local v = redis.call('GET', q.pkey)
      local tat, e, b
      if v then tat, e, b = string.match(v, '^([^,]+),([^,]+),([^,]+)$') end
      tat, e, b = tonumber(tat), tonumber(e), tonumber(b)
      if tat and e and b and e > 0 then
        local owed = max(tat - now, 0)
        used = b - min(floor(max(e * b - owed, 0) / e), b)
      end
    elseif pk == 'f' then
      local v = redis.call('GET', q.pkey)
      local e, u, w, l
      if v then
        e, u, w, l = string.match(v, '^([^,]+),([^,]+),([^,]+),([^,;]+);%d+$')
        if not e then e, u, w, l = string.match(v, '^([^,]+),([^,]+),([^,]+),([^,]+)$') end
      end
      e, u, w, l = tonumber(e), tonumber(u), tonumber(w), tonumber(l)
      if e and u and w and l and w > 0 and e > now then
        used = l
        if e == (floor(now / w) + 1) * w then used = min(u, l) end
      end
    elseif pk == 's' then
      -- Bookings of one each, but perhaps the oldest, are counted by
      -- Redis; others are read from the newest end, no more than the old
      -- limit's worth.
      local cut = now - q.pb
      local sum, _, card = read_meta(q.pkey)
      local oldest = redis.call('ZRANGEBYSCORE', q.pkey, 0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      local c0 = oldest[1] and cost_of(oldest[1])
      if sum and card and c0 and sum - card == c0 - 1 then
        used = redis.call('ZCOUNT', q.pkey, string.format('(%d', max(cut, 0)), '+inf')
        if tonumber(oldest[2]) > cut then used = used + c0 - 1 end
      elseif c0 then
        used = live_from_newest(q.pkey, cut, q.pa)
      end
      used = min(used, q.pa)
    elseif pk == 'a' then
      -- What the counter counts now, rounded up (or the limit, when a
      -- later window is booked), as SlidingCounter::remaining.
      local v = redis.call('GET', q.pkey)
      local e, p, u, l, w
      if v then e, p, u, l, w = string.match(v, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$') end
      e, p, u, w = tonumber(e), tonumber(p), tonumber(u), tonumber(w)
      if e and p and u and w and w > 0 and e + w > now then
        local en = (floor(now / w) + 1) * w
        if e < en then
          if e + w == en then p = u else p = 0 end
          u = 0; e = en
        end
        if e == en then
          local weighed, rest = mul_div(p, e - now, w)
          if rest > 0 then weighed = weighed + 1 end
          used = min(weighed + u, q.pa)
        else
          used = q.pa
        end
      end
    else
      local v = redis.call('GET', q.pkey)
      local st, u, x
      if v then st, u, x = string.match(v, '^([^,]+),([^,]+),([^,]+)$') end
      st, u, x = tonumber(st), tonumber(u), tonumber(x)
      if st and u and x and not ((u == 0 and st <= now) or x <= now) then
        used = min(u, q.pa)
      end
    end
    if used > 0 then
      local kind = q.kind
      if kind == 'g' then
        q.tat = max(q.tat, now + q.a * min(used, q.b))
      elseif kind == 'f' then
        q.e = (floor(now / q.b) + 1) * q.b
        q.u = used
      elseif kind == 's' then
        local take = min(used, q.a)
        q.seq = q.seq + 1
        redis.call('ZADD', q.key, now, fmt_member(q.seq, take))
        q.sum = q.sum + take
        q.card = q.card + 1
        q.last = now
      elseif kind == 'a' then
        q.e = (floor(now / q.b) + 1) * q.b
        q.u = used
      else
        q.s = now; q.u = used; q.x = now + q.b
      end
      q.converted = true
    end
    -- UNLINK: a large set is freed off Redis's main thread.
    redis.call('UNLINK', q.pkey)
  end
end

-- A key that spent under another rule (as far as its marker remembers, or
-- under the default before any rule came) starts each quota it has no
-- state in spent, never with a free burst.
local was = false
if rule ~= '' then
  was = redis.call('GET', KEYS[1])
  if not was and probe and redis.call('EXISTS', probe) == 1 then
    was = '(default)'
  end
end
if was and was ~= rule then
  for _, q in ipairs(quotas) do
    if q.fresh then
      local kind = q.kind
      q.spent = true
      if kind == 'g' then
        q.tat = max(q.tat, now + q.tol)
      elseif kind == 'f' then
        q.e = (floor(now / q.b) + 1) * q.b
        q.u = q.a
      elseif kind == 's' then
        -- A whole window's worth now.
        q.seq = q.seq + 1
        redis.call('ZADD', q.key, now, fmt_member(q.seq, q.a))
        q.sum = q.sum + q.a
        q.card = q.card + 1
        q.last = now
      elseif kind == 'a' then
        q.e = (floor(now / q.b) + 1) * q.b
        q.u = q.a
        q.l = max(q.l, now)
      else
        q.s = now; q.u = q.a; q.x = now + q.b
      end
    end
  end
end

-- The earliest instant every quota admits.
local at = now
local slowest = 0
for n, q in ipairs(quotas) do
  local kind = q.kind
  local earliest
  if kind == 'g' then
    -- So far ahead no clock running forwards leaves it (waiters, and one
    -- burst of debt a settled charge may add): start afresh.
    if q.tat > now + 2 * q.tol + horizon then q.tat = 0 end
    earliest = max(max(q.tat, now) + q.a * q.c - q.tol, now)
  elseif kind == 'f' then
    if q.e > (floor((now + horizon) / q.b) + 1) * q.b then q.e = 0; q.u = 0; q.t = nil end
    if q.e <= now then
      q.e = 0; q.u = 0; q.t = nil
      earliest = now
    elseif q.u + q.c <= q.a then
      earliest = max(q.e - q.b, now)
    else
      earliest = q.e
    end
  elseif kind == 's' then
    if q.last and q.last > now + horizon then
      redis.call('UNLINK', q.key)
      q.last = nil
      q.sum = 0
      q.card = 0
      q.ttl = 0
    end
    earliest = max(q.last or now, now)
    local room = max(q.a - q.c, 0)
    -- A booking exactly a window old has expired.
    local cut = now - q.b
    -- Every booking but perhaps the oldest counts one (a booking never
    -- costs less; the oldest can be what a key took over, spent, when
    -- its state was made): Redis counts them, in O(log n), and the
    -- expired go at most TRIM a call, so no call pays for a whole window
    -- leaving at once. Those left over are counted out here and go in
    -- later calls.
    if q.card > 0 and q.sum ~= q.card then
      local oldest = redis.call('ZRANGE', q.key, q.base, q.base, 'WITHSCORES')
      local c0 = oldest[1] and cost_of(oldest[1])
      if c0 and q.sum - q.card == c0 - 1 then
        q.heavy = c0 - 1
        q.heavy_at = tonumber(oldest[2])
      end
    elseif q.sum == q.card then
      q.heavy = 0
    end
    if q.heavy then
      local gone = 0
      if q.card > 0 then gone = redis.call('ZCOUNT', q.key, 0, cut) end
      local extra = 0
      if q.heavy > 0 and q.heavy_at <= cut then extra = q.heavy end
      if gone > 0 then
        local n = min(gone, TRIM)
        redis.call('ZREMRANGEBYRANK', q.key, q.base, q.base + n - 1)
        q.sum = q.sum - n - extra
        q.card = q.card - n
        q.trimmed = true
        q.heavy = q.heavy - extra
        gone = gone - n
      end
      q.first = gone
      -- What has to leave, oldest first: the heavy one (when live) takes
      -- 1 + heavy at once.
      local over = q.sum - gone - room
      if over > 0 then
        local k = over
        if q.heavy > 0 then k = max(over - q.heavy, 1) end
        local r = q.base + gone + k - 1
        local page = redis.call('ZRANGE', q.key, r, r, 'WITHSCORES')
        if page[2] then earliest = max(earliest, tonumber(page[2]) + q.b) end
      end
    else
      -- Bookings of several units. The expired go at most TRIM a call
      -- (read for their costs, then removed); whether this one fits, and
      -- when, is read from the newest end: the last booking that has to
      -- leave is the one past which the newer ones leave no room, and no
      -- more than the limit's worth is read to find it, whatever waiters
      -- or expired bookings the set holds.
      local gone = redis.call('ZRANGEBYSCORE', q.key, 0, cut, 'LIMIT', 0, TRIM)
      if #gone > 0 then
        for _, member in ipairs(gone) do
          q.sum = q.sum - cost_of(member)
        end
        redis.call('ZREMRANGEBYRANK', q.key, q.base, q.base + #gone - 1)
        q.card = q.card - #gone
        q.trimmed = true
      end
      local acc, from = 0, 0
      local done = false
      while not done do
        local page = redis.call('ZREVRANGE', q.key, from, from + 31, 'WITHSCORES')
        if #page == 0 then break end
        for j = 1, #page, 2 do
          local booked = tonumber(page[j + 1])
          if booked <= cut or booked < 0 then done = true; break end
          acc = acc + cost_of(page[j])
          if acc > room then
            earliest = max(earliest, booked + q.b)
            done = true
            break
          end
        end
        from = from + 32
      end
    end
  elseif kind == 'a' then
    -- Booked further ahead than any wait allows: the clock ran backwards.
    if q.l > now + horizon or q.e > (floor((now + horizon) / q.b) + 1) * q.b then
      q.e = 0; q.p = 0; q.u = 0; q.l = 0
    end
    -- Moved on to the window holding now.
    local en = (floor(now / q.b) + 1) * q.b
    if q.e < en then
      if q.e + q.b == en then q.p = q.u else q.p = 0 end
      q.u = 0; q.e = en
    end
    -- The first instant, not before the latest booking, at which
    -- previous * (end - t) + (current + cost) * window <= limit * window:
    -- in this window, or else in the next.
    local from = max(now, q.l, q.e - q.b)
    if q.u + q.c <= q.a then
      if q.p == 0 or q.a - q.u - q.c >= q.p then
        earliest = from
      else
        earliest = max(from, q.e - mul_div(q.a - q.u - q.c, q.b, q.p))
      end
    elseif q.u == 0 or q.a - q.c >= q.u then
      earliest = q.e
    else
      earliest = max(q.e, q.e + q.b - mul_div(q.a - q.c, q.b, q.u))
    end
  else
    -- A turn a dropped waiter opened ahead holds the key until it starts
    -- (the turn before it was full).
    if (q.u == 0 and q.s <= now) or q.x <= now or q.s > now + horizon then
      q.s = 0; q.u = 0; q.x = 0
      earliest = now
    elseif q.u + q.c <= q.a then
      earliest = max(now, q.s)
    else
      -- Only a new turn, or staleness, frees the budget.
      earliest = q.x
    end
  end
  if earliest > at then
    at = earliest
    slowest = n - 1
  end
end

-- Refused: nothing booked. Only what changed regardless of this request
-- is written (below): a sliding window's expired bookings, which its sum
-- loses; a state a retune converted, or one a key moving between rules
-- starts spent, and the key's new rule. Both conversions count from now:
-- made again at each later request instead, from the old state, they
-- would keep the key refused at the old rate, past its retry_after.
local refused = at - now > max_wait
local reply = { 0, at - now, slowest }

-- Else book every quota at `at`.
if not refused then
  reply = { 1, at, now, 0, 0, 0 }
  for _, q in ipairs(quotas) do
    local kind = q.kind
    if kind == 'g' then
      q.tat = max(q.tat, at, now) + q.a * q.c
      reply[#reply + 1] = q.tat
    elseif kind == 'f' then
      local e = (floor(at / q.b) + 1) * q.b
      if e == q.e then
        q.u = q.u + q.c
        q.t = max(q.t or at, at)
      else
        q.e = e; q.u = q.c; q.t = at
      end
      reply[#reply + 1] = e
    elseif kind == 's' then
      q.seq = q.seq + 1
      local member = fmt_member(q.seq, q.c)
      -- Added with the figures, in one ZADD (below).
      q.booked, q.booked_at = member, at
      q.sum = q.sum + q.c
      q.card = q.card + 1
      q.last = max(q.last or at, at)
      reply[#reply + 1] = member
    elseif kind == 'a' then
      local e = (floor(at / q.b) + 1) * q.b
      if q.e < e then
        if q.e + q.b == e then q.p = q.u else q.p = 0 end
        q.u = 0; q.e = e
      end
      q.u = min(q.u + q.c, 4294967295)
      q.l = max(q.l, at)
      reply[#reply + 1] = q.e
    else
      if q.u == 0 or at >= q.x then
        q.s = at; q.u = q.c; q.x = at + q.b
      else
        q.u = q.u + q.c
      end
      reply[#reply + 1] = q.s
    end
  end
end

if not refused and ARGV[4] == '1' then
  -- What remains of the tightest quota, as of the instant the request
  -- goes: now, unless it waits.
  local goes = now
  if ARGV[5] == '1' then goes = at end
  local left, reset, tightest = -1, 0, 0
  for n, q in ipairs(quotas) do
    local kind = q.kind
    local l, r
    if kind == 'g' then
      local owed = max(q.tat - goes, 0)
      l = min(floor(max(q.tol - owed, 0) / q.a), q.b)
      r = owed
    elseif kind == 'f' then
      if q.e <= goes then
        l = q.a; r = 0
      else
        local used = q.a
        if q.e == (floor(goes / q.b) + 1) * q.b then used = q.u end
        l = max(q.a - used, 0); r = q.e - goes
      end
    elseif kind == 's' then
      local live
      if q.heavy then
        -- Less the expired bookings a count left in place (ones), and
        -- those that leave by then.
        live = q.sum - q.first
        if goes > now then
          live = q.sum - redis.call('ZCOUNT', q.key, 0, string.format('%d', goes - q.b))
          if q.heavy > 0 and q.heavy_at <= goes - q.b then live = live - q.heavy end
        end
      else
        -- The booking just made is not in the set yet (see below).
        live = live_from_newest(q.key, goes - q.b, q.a) + q.c
      end
      l = max(q.a - live, 0); r = max((q.last or 0) + q.b - goes, 0)
    elseif kind == 'a' then
      local e, p, u = q.e, q.p, q.u
      local eg = (floor(goes / q.b) + 1) * q.b
      if e < eg then
        if e + q.b == eg then p = u else p = 0 end
        u = 0; e = eg
      end
      if e == eg then
        local weighed, rest = mul_div(p, e - goes, q.b)
        if rest > 0 then weighed = weighed + 1 end
        l = max(q.a - weighed - u, 0)
      else
        -- A later window booked: this one is full.
        l = 0
      end
      if u > 0 then r = e + q.b - goes elseif p > 0 then r = e - goes else r = 0 end
    else
      if (q.u == 0 and q.s <= goes) or q.x <= goes then
        l = q.a; r = 0
      else
        l = max(q.a - q.u, 0); r = q.x - goes
      end
    end
    if left < 0 or l < left or (l == left and r > reset) then
      left, reset, tightest = l, r, n - 1
    end
  end
  reply[4], reply[5], reply[6] = left, reset, tightest
end

-- Write every state back, with a TTL a second past the moment it goes
-- idle, so that it never expires early.
for _, q in ipairs(quotas) do
  local kind = q.kind
  -- Numbers as integers: tostring would write 1e+15.
  local fmt = string.format
  if refused and not (q.spent or q.converted) then
    if q.trimmed then
      redis.call('ZADD', q.key, -1 - q.sum, '#s', -1 - q.card, '#c')
    end
  elseif kind == 'g' then
    redis.call('SET', q.key, fmt('%d,%d,%d', q.tat, q.a, q.b),
      'PX', max(ceil((q.tat - now) / 1000), 0) + 1000)
  elseif kind == 'f' then
    -- A window filled or carried without a booking holds none after now.
    redis.call('SET', q.key, fmt('%d,%d,%d,%d;%d', q.e, q.u, q.b, q.a, min(q.t or now, max(q.e - 1, 0))),
      'PX', max(ceil((q.e - now) / 1000), 0) + 1000)
  elseif kind == 's' then
    -- The TTL holds a second past the latest booking's expiry; set a
    -- second further still, so that a busy key sets it about once a
    -- second, not at every booking.
    local needed = now + (max(ceil(((q.last or now) + q.b - now) / 1000), 0) + 1000) * 1000
    local ttl = q.ttl < needed
    if ttl then q.ttl = needed + 1000000 end
    local figures = { -1 - q.sum, '#s', -1 - q.seq, '#n', -1 - q.card, '#c',
      -1 - (q.last or 0), '#l', -1 - q.ttl, '#x' }
    if q.booked then
      figures[11], figures[12] = q.booked_at, q.booked
    end
    redis.call('ZADD', q.key, unpack(figures))
    if ttl then redis.call('PEXPIRE', q.key, ceil((q.ttl - now) / 1000)) end
  elseif kind == 'a' then
    -- Idle a window after its window ends.
    redis.call('SET', q.key, fmt('%d,%d,%d,%d,%d,%d', q.e, q.p, q.u, q.l, q.b, q.a),
      'PX', max(ceil((q.e + q.b - now) / 1000), 0) + 1000)
  else
    redis.call('SET', q.key, fmt('%d,%d,%d', q.s, q.u, q.x),
      'PX', max(ceil((q.x - now) / 1000), 0) + 1000)
  end
end
if rule ~= '' then
  if was == rule then
    if not refused then redis.call('PEXPIRE', KEYS[1], ARGV[7]) end
  elseif not refused or was then
    redis.call('SET', KEYS[1], rule, 'PX', ARGV[7])
  end
end
return reply
