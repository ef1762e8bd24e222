-- Put a note on a board every replica reads (src/redis/notes.rs).
--
-- KEYS[1]  the board: a hash of name -> "put:expires:text" (microseconds
--          of Redis's clock)
-- ARGV     the name (already hashed), the text, its lifetime in
--          microseconds, now (empty: Redis's TIME), the most notes a
--          board holds
--
-- Returns 1 when put, 0 when the board is full of live notes.

local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local key, name, text = KEYS[1], ARGV[1], ARGV[2]
local ttl = tonumber(ARGV[3])
local most = tonumber(ARGV[5])
if redis.call('HEXISTS', key, name) == 0 and redis.call('HLEN', key) >= most then
  -- Full: make room from expired notes only, never from live ones.
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local expires = tonumber(string.match(all[i + 1], '^%d+:(%d+):'))
    if not expires or expires <= now then redis.call('HDEL', key, all[i]) end
  end
  if redis.call('HLEN', key) >= most then return 0 end
end
-- %d: Lua 5.1 writes a number this large with an exponent otherwise.
redis.call('HSET', key, name, string.format('%d:%d:', now, now + ttl) .. text)
-- The board lives as long as its longest-lived note.
local left = redis.call('PTTL', key)
local wanted = math.ceil(ttl / 1000)
if left < wanted then redis.call('PEXPIRE', key, wanted) end
return 1
