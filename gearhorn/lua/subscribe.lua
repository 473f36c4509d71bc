-- Add or remove one subscriber atomically and announce the change.
-- KEYS[1] the subscriber set (<p>topic:<T> or <p>prefix:<P*>)
-- KEYS[2] the index set (<p>topics or <p>prefixes)
-- KEYS[3] the versions hash (<p>versions)
-- ARGV[1] "1" to subscribe, "0" to unsubscribe
-- ARGV[2] topic or prefix pattern (the index member)
-- ARGV[3] client id
-- ARGV[4] version field: the topic, or "*" for a prefix pattern
-- ARGV[5] matchmaking channel
-- Publishes {"op", "topic", "client_id", "version"} on the channel (JSON made
-- here with cjson, so no name can be mistaken for a placeholder).
-- Returns the number of subscribers after the change.
local changed
if ARGV[1] == '1' then
  changed = redis.call('SADD', KEYS[1], ARGV[3])
  if changed == 1 then redis.call('SADD', KEYS[2], ARGV[2]) end
else
  changed = redis.call('SREM', KEYS[1], ARGV[3])
  if changed == 1 and redis.call('SCARD', KEYS[1]) == 0 then
    redis.call('SREM', KEYS[2], ARGV[2])
  end
end
-- Announce even a no-op so a caller may rely on one message per request;
-- bump the version only on a real change (it invalidates caches).
local version = redis.call('HGET', KEYS[3], ARGV[4]) or '0'
if changed == 1 then version = redis.call('HINCRBY', KEYS[3], ARGV[4], 1) end
local op = 'unsubscribe'
if ARGV[1] == '1' then op = 'subscribe' end
redis.call('PUBLISH', ARGV[5], cjson.encode({op = op, topic = ARGV[2], client_id = ARGV[3],
                                              version = tostring(version)}))
return redis.call('SCARD', KEYS[1])
