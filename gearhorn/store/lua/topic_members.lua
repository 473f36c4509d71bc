-- The direct subscribers of a topic, unless the caller's cached copy is current.
-- KEYS[1] the topic's change counter (<p>topic-version:{T})
-- KEYS[2] the topic's subscriber set (<p>topic:{T}), same hash slot
-- ARGV[1] the caller's cached version ("" if none)
-- Returns {version} when the cache is current, else {version, member, ...}.
-- Every change to the set bumps the version in the same script
-- (subscribe.lua), which is what makes the worker cache safe.
local version = redis.call('GET', KEYS[1]) or '0'
if version == ARGV[1] then return {version} end
local result = redis.call('SMEMBERS', KEYS[2])
table.insert(result, 1, version)
return result
