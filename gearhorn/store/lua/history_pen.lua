-- Give back a topic's pen (lua/history_append.lua): its holder has written
-- every offset it gave. When another caller waited for it ('wanted'), no
-- pen is granted for ARGV[2] ms: the topic has several writers, and they
-- take their offsets from Redis.
-- KEYS[1] the history's offset and epoch (<p>history-meta:{T}, a hash)
-- ARGV[1] the holder's id, ARGV[2] ms of calm after a wanted pen
-- Returns 1 if the caller held it, else 0.
local meta = KEYS[1]
if redis.call('HGET', meta, 'pen') ~= ARGV[1] then
  return 0
end
if redis.call('HGET', meta, 'wanted') then
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  redis.call('HSET', meta, 'calm_until', now + tonumber(ARGV[2]))
end
redis.call('HDEL', meta, 'pen', 'pen_until', 'wanted')
return 1
