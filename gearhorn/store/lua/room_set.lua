-- The warden's round sets each reject-publish queue's room.
-- KEYS[1] <p>room (lua/room_claim.lua has its fields)
-- ARGV: queue, room, room bytes ("" for no bytes limit), claimed at the
-- round's start, claimed bytes at the round's start: quintuples. The room is
-- what gearmand's count left, less what workers claimed since the round
-- started (those copies may not be in that count yet: counting them twice
-- refuses early, never late). Queues not named lose their room fields:
-- no longer reject-publish, or gone.
local named = {}
for i = 1, #ARGV, 5 do
  local queue = ARGV[i]
  named[queue] = true
  local claimed = tonumber(redis.call('HGET', KEYS[1], queue .. ' claimed') or '0')
  local claimed_bytes = tonumber(redis.call('HGET', KEYS[1], queue .. ' claimed-bytes') or '0')
  local since = claimed - tonumber(ARGV[i + 3])
  local since_bytes = claimed_bytes - tonumber(ARGV[i + 4])
  redis.call('HSET', KEYS[1], queue, tonumber(ARGV[i + 1]) - since)
  if ARGV[i + 2] == '' then
    redis.call('HDEL', KEYS[1], queue .. ' bytes')
  else
    redis.call('HSET', KEYS[1], queue .. ' bytes', tonumber(ARGV[i + 2]) - since_bytes)
  end
end
local fields = redis.call('HKEYS', KEYS[1])
for _, field in ipairs(fields) do
  local queue = string.match(field, '^(%S+)')
  if not named[queue] then redis.call('HDEL', KEYS[1], field) end
end
return #fields
