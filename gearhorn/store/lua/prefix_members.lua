-- The subscribers of the prefix patterns a topic matches, unless cached.
-- KEYS[1] the prefix change counter ({<p>prefixes}:version)
-- KEYS[2..] the sets ({<p>prefixes}:<P*>) of the patterns the topic starts
--           with, by the caller's list of patterns (all in the prefixes' slot)
-- ARGV[1] the prefix version the caller's list of patterns belongs to
-- ARGV[2] the prefix version of the caller's cached members ("" if none)
-- ARGV[3..] those patterns, in the order of KEYS[2..]
-- Returns {"!prefixes", version} when the caller's list of patterns is out
-- of date (it reads the index again and calls once more); {version} when the
-- cache is current; else {version, member, ...}, each member being
-- "<pattern>\n<client>". Every prefix change bumps the version, so a
-- current list of patterns is exact.
local version = redis.call('GET', KEYS[1]) or '0'
if version ~= ARGV[1] then return {'!prefixes', version} end
if version == ARGV[2] then return {version} end
local result = {version}
for i = 2, #KEYS do
  local pattern = ARGV[i + 1]
  for _, member in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    result[#result + 1] = pattern .. '\n' .. member
  end
end
return result
