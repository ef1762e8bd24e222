-- One route's cooldown, shared by every replica: read it before a request,
-- or fold in what a response said, as src/backoff/cooldown.rs does in
-- process. Times in microseconds of Redis's clock.
--
-- KEYS[1]   the route's state: a hash of u (the cooldown's end), s (the
--           streak of 429s), g (which cooldown start this is: it only
--           grows, the instant it started at least), f (when a quiet route
--           forgets its streak)
-- ARGV      mode (read; 429; 503; ok: a success), the generation the
--           request was sent under, an advised wait (empty: none), how
--           long after a cooldown a quiet route keeps its streak, now
--           (empty: Redis's TIME), then the exponential delays for a
--           streak of 1, 2, ... (the last one for any longer streak)
--
-- Returns {now, until, streak, generation}.

local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local key = KEYS[1]
local mode = ARGV[1]
local v = redis.call('HMGET', key, 'u', 's', 'g', 'f')
local u = tonumber(v[1]) or 0
local s = tonumber(v[2]) or 0
local g = tonumber(v[3]) or 0
local f = tonumber(v[4]) or 0
-- A quiet route forgets its streak.
if s > 0 and u <= now and f <= now then s = 0 end
if mode == 'read' then
  return { now, u, s, g }
end

local seen = tonumber(ARGV[2]) or 0
local advised = tonumber(ARGV[3])
local forget_after = tonumber(ARGV[4]) or 0
-- A response to a request sent before the route's latest cooldown started
-- says nothing new about the streak: it was in flight.
local fresh = seen >= g
local wait = nil
if mode == '429' then
  if fresh then s = s + 1 end
  if advised then
    wait = advised
  elseif fresh then
    local n = math.min(s, #ARGV - 5)
    if n > 0 then wait = tonumber(ARGV[5 + n]) end
  end
elseif mode == '503' then
  wait = advised
elseif fresh then
  s = 0
  wait = advised
end
-- The longer of the cooldown in force and the new one wins. Its generation
-- is at least now: it only grows, even after the route's state expired
-- (replicas keep the largest they saw, and a restart from 0 would make 429s
-- already in flight count as fresh).
if wait and now + wait > u and wait > 0 then
  u = now + wait
  f = u + forget_after
  g = math.max(g + 1, now)
end

if s == 0 and u <= now then
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'u', u, 's', s, 'g', g, 'f', f)
  local idle = math.max(u, f)
  redis.call('PEXPIRE', key, math.max(math.ceil((idle - now) / 1000), 0) + 1000)
end
return { now, u, s, g }
