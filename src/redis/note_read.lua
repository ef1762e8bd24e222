-- Read every live note of a board (src/redis/notes.rs), dropping the
-- expired ones.
--
-- KEYS[1]  the board (see note_put.lua)
-- ARGV     now (empty: Redis's TIME)
--
-- Returns a flat list of put, text, put, text, ...

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local key = KEYS[1]
local all = redis.call('HGETALL', key)
local out = {}
for i = 1, #all, 2 do
  local put, expires, text = string.match(all[i + 1], '^(%d+):(%d+):(.*)$')
  if put and tonumber(expires) > now then
    out[#out + 1] = put
    out[#out + 1] = text
  else
    redis.call('HDEL', key, all[i])
  end
end
return out
