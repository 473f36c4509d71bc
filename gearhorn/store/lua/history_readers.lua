-- Count a topic's stream readers, which keep a real-time topic's history
-- (gearhorn/historypolicy.py: "while_read"): while it has some, and for
-- 'linger' seconds after the last left, appends to it go in
-- (lua/history_append.lua); then it expires, and a reader that comes back
-- later finds a new epoch (x-recovered:false), never a silent gap.
-- KEYS[1] the history's offset and epoch (<p>history-meta:{T}, a hash)
-- KEYS[2] the history (<p>history:{T}), KEYS[3] its recent ids; same slot
-- ARGV[1] '1' a reader came, '0' one left
-- ARGV[2] seconds kept after the last reader left ('' : as recorded)
-- ARGV[3] an epoch to take if the topic has none
-- Returns the readers now.
local meta = KEYS[1]
if ARGV[1] == '1' then
  if not redis.call('HGET', meta, 'epoch') then
    -- What is left of an old epoch's stream is not this epoch's.
    redis.call('DEL', KEYS[2], KEYS[3])
    redis.call('HSET', meta, 'epoch', ARGV[3])
  end
  if ARGV[2] ~= '' then redis.call('HSET', meta, 'linger', ARGV[2]) end
  redis.call('PERSIST', meta)
  return redis.call('HINCRBY', meta, 'readers', 1)
end
if redis.call('EXISTS', meta) == 0 then return 0 end
local left = redis.call('HINCRBY', meta, 'readers', -1)
if left <= 0 then
  left = 0
  redis.call('HSET', meta, 'readers', 0)
  local linger = ARGV[2]
  if linger == '' then linger = redis.call('HGET', meta, 'linger') or '300' end
  redis.call('EXPIRE', meta, linger)
end
return left
