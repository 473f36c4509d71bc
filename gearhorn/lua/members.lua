-- The subscribers of a topic, unless the caller's cached copy is current.
-- KEYS[1] the versions hash (<p>versions)
-- KEYS[2] the topic's subscriber set (<p>topic:<T>)
-- KEYS[3] the prefix index (<p>prefixes)
-- ARGV[1] topic
-- ARGV[2] the caller's cached version token ("" if none)
-- ARGV[3] key prefix, to name <p>prefix:<P*> sets (read only, never written)
-- Returns {token} when the cache is current, else {token, member, ...} with
-- the direct subscribers and those of every prefix the topic starts with.
-- The token is "<topic version>.<prefix version>": any change to either set
-- changes it, which is what makes the worker cache safe (DESIGN.md promise).
local tv = redis.call('HGET', KEYS[1], ARGV[1]) or '0'
local pv = redis.call('HGET', KEYS[1], '*') or '0'
local token = tv .. '.' .. pv
if token == ARGV[2] then return {token} end
local result = {token}
local seen = {}
for _, member in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  seen[member] = true
  result[#result + 1] = member
end
for _, pattern in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local stem = string.sub(pattern, 1, -2)
  if string.sub(ARGV[1], 1, #stem) == stem then
    for _, member in ipairs(redis.call('SMEMBERS', ARGV[3] .. 'prefix:' .. pattern)) do
      -- A prefix subscriber's copies go to <pattern>_<client>; mark them.
      local name = pattern .. '\n' .. member
      if not seen[name] then
        seen[name] = true
        result[#result + 1] = name
      end
    end
  end
end
return result
