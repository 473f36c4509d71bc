-- The subscribers of a topic, unless the caller's cached copy is current.
-- KEYS[1] the versions hash (<p>versions)
-- KEYS[2] the topic's subscriber set (<p>topic:<T>)
-- KEYS[3..] the subscriber sets (<p>prefix:<P*>) of the prefix patterns that
--           the topic starts with, by the caller's list of patterns
-- ARGV[1] topic
-- ARGV[2] the caller's cached version token ("" if none)
-- ARGV[3] the prefix version the caller's list of patterns belongs to
-- ARGV[4..] those patterns, in the order of KEYS[3..]
-- Returns {"!prefixes", version} when the caller's list of patterns is out of
-- date (it reads <p>prefixes again and calls once more); {token} when the
-- cache is current; else {token, member, ...}: the direct subscribers and
-- those of the patterns, marked "<pattern>\n<client>". The token is
-- "<topic version>.<prefix version>": any change to either set changes it,
-- which is what makes the worker cache safe (DESIGN.md promise). Every
-- prefix change bumps the prefix version, so a current list is exact.
local pv = redis.call('HGET', KEYS[1], '*') or '0'
if pv ~= ARGV[3] then return {'!prefixes', pv} end
local tv = redis.call('HGET', KEYS[1], ARGV[1]) or '0'
local token = tv .. '.' .. pv
if token == ARGV[2] then return {token} end
local result = {token}
local seen = {}
for _, member in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  seen[member] = true
  result[#result + 1] = member
end
for i = 3, #KEYS do
  local pattern = ARGV[i + 1]
  for _, member in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    local name = pattern .. '\n' .. member
    if not seen[name] then
      seen[name] = true
      result[#result + 1] = name
    end
  end
end
return result
