-- admit.lua for one sliding window counter with no rules and no quota it
-- replaced (rate_limit/redis/mod.rs sends this one only those): the same
-- keys, arguments, state and reply, the same arithmetic, and nothing
-- else, so that it costs Redis what any counter must (TIME, GET, SET PX)
-- and little more. Kept beside admit.lua's counter: a change to one is a
-- change to both (tests/redis_model.rs runs every history through each).
-- A state kept under another window (a retune to convert) is left to the
-- whole script: the answer is {2}, and nothing is written.
--
-- KEYS[2]   the quota's state, "e,p,u,l,w,n" (KEYS[1], the rule marker,
--           is unused without rules)
-- ARGV      as admit.lua's: cost, max_wait, horizon, info, waits, rule
--           (empty), marker_ttl, now (empty: Redis's TIME), probe (0),
--           then the quota: kind (a; A counts one per request), limit,
--           window, and '-' (none replaced)

local now = tonumber(ARGV[8])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local floor, max = math.floor, math.max
local c = tonumber(ARGV[1])
if ARGV[10] == 'A' then c = 1 end
local a, b = tonumber(ARGV[11]), tonumber(ARGV[12])
local horizon = tonumber(ARGV[3])
local key = KEYS[2]
local e, p, u, l = 0, 0, 0, 0
local v = redis.call('GET', key)
if v then
  -- As admit.lua reads it: whole numbers only, else the whole script's.
  local se, sp, su, sl, sw = string.match(v, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
  if tonumber(sw) ~= b then return { 2 } end
  e, p, u, l = tonumber(se) or 0, tonumber(sp) or 0, tonumber(su) or 0, tonumber(sl) or 0
end

if l > now + horizon or e > (floor((now + horizon) / b) + 1) * b then
  e, p, u, l = 0, 0, 0, 0
end
local en = (floor(now / b) + 1) * b
if e < en then
  if e + b == en then p = u else p = 0 end
  u = 0; e = en
end
local from = max(now, l, e - b)
local at
-- The first instant, in this window or the next, at which
-- previous * (end - t) + (current + cost) * window <= limit * window: at
-- once, or `span` = floor(x * window / d) before an end. Exact past 2^53
-- (a large limit times a long window) as admit.lua's mul_div, but written
-- out where it is used: a function made on every call costs Redis about
-- half a microsecond, more than the sums.
local this = u + c <= a
local x, d
if this then
  if p == 0 or a - u - c >= p then at = from else x, d = a - u - c, p end
elseif u == 0 or a - c >= u then
  at = e
else
  x, d = a - c, u
end
if x then
  local span
  if x * b < 9007199254740992 then
    span = floor(x * b / d)
    local r = x * b - span * d
    if r < 0 then span = span - 1 elseif r >= d then span = span + 1 end
  else
    -- The long division of the window in bytes: every step under 2^53.
    local r = 0
    span = 0
    for shift = 40, 0, -8 do
      local acc = r * 256 + x * (floor(b / 2 ^ shift) % 256)
      local digit = floor(acc / d)
      local rest = acc - digit * d
      if rest < 0 then digit = digit - 1 elseif rest >= d then digit = digit + 1 end
      r = acc - digit * d
      span = span * 256 + digit
    end
  end
  if this then at = max(from, e - span) else at = max(e, e + b - span) end
end
if at - now > tonumber(ARGV[2]) then
  return { 0, at - now, 0 }
end
local eb = (floor(at / b) + 1) * b
if e < eb then
  if e + b == eb then p = u else p = 0 end
  u = 0; e = eb
end
u = math.min(u + c, 4294967295)
l = max(l, at)
local reply = { 1, at, now, 0, 0, 0, e }
if ARGV[4] == '1' then
  local goes = now
  if ARGV[5] == '1' then goes = at end
  local ge, gp, gu = e, p, u
  local eg = (floor(goes / b) + 1) * b
  if ge < eg then
    if ge + b == eg then gp = gu else gp = 0 end
    gu = 0; ge = eg
  end
  if ge == eg then
    -- gp * (ge - goes) / b rounded up, as at `span` above.
    local y = ge - goes
    local weighed, rest
    if gp * y < 9007199254740992 then
      weighed = floor(gp * y / b)
      rest = gp * y - weighed * b
      if rest < 0 then weighed = weighed - 1; rest = rest + b
      elseif rest >= b then weighed = weighed + 1; rest = rest - b end
    else
      rest, weighed = 0, 0
      for shift = 40, 0, -8 do
        local acc = rest * 256 + gp * (floor(y / 2 ^ shift) % 256)
        local digit = floor(acc / b)
        local left = acc - digit * b
        if left < 0 then digit = digit - 1 elseif left >= b then digit = digit + 1 end
        rest = acc - digit * b
        weighed = weighed * 256 + digit
      end
    end
    if rest > 0 then weighed = weighed + 1 end
    reply[4] = max(a - weighed - gu, 0)
  end
  if gu > 0 then reply[5] = ge + b - goes elseif gp > 0 then reply[5] = ge - goes end
end
redis.call('SET', key, string.format('%d,%d,%d,%d,%d,%d', e, p, u, l, b, a),
  'PX', max(math.ceil((e + b - now) / 1000), 0) + 1000)
return reply
