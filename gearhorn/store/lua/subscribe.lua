-- Add or remove one subscriber atomically and announce the change.
-- KEYS[1] the subscriber set (<p>topic:{T} or {<p>prefixes}:<P*>)
-- KEYS[2] its change counter (<p>topic-version:{T} or {<p>prefixes}:version)
-- KEYS[3] for a prefix pattern only: the index of patterns ({<p>prefixes})
-- ARGV[1] "1" to subscribe, "0" to unsubscribe
-- ARGV[2] topic or prefix pattern
-- ARGV[3] client id
-- ARGV[4] matchmaking channel
-- Every key shares one hash slot (the topic's, or the prefixes'). Topics are
-- indexed (<p>topics, another slot) by the caller, gearhorn/store/registry.py.
-- Publishes {"op", "topic", "client_id", "version"} on the channel (JSON made
-- here with cjson, so no name can be mistaken for a placeholder).
-- Returns {subscribers after the change, 1 if it changed anything else 0}.
local changed
if ARGV[1] == '1' then
  changed = redis.call('SADD', KEYS[1], ARGV[3])
  if changed == 1 and KEYS[3] then redis.call('SADD', KEYS[3], ARGV[2]) end
else
  changed = redis.call('SREM', KEYS[1], ARGV[3])
  if changed == 1 and KEYS[3] and redis.call('SCARD', KEYS[1]) == 0 then
    redis.call('SREM', KEYS[3], ARGV[2])
  end
end
-- Announce even a no-op so a caller may rely on one message per request;
-- bump the version only on a real change (it invalidates caches).
local version = redis.call('GET', KEYS[2]) or '0'
if changed == 1 then version = redis.call('INCR', KEYS[2]) end
local op = 'unsubscribe'
if ARGV[1] == '1' then op = 'subscribe' end
redis.call('PUBLISH', ARGV[4], cjson.encode({op = op, topic = ARGV[2], client_id = ARGV[3],
                                              version = tostring(version)}))
return {redis.call('SCARD', KEYS[1]), changed}
