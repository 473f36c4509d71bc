-- The warden's round sets each reject-publish queue's room.
-- KEYS[1] <p>room (lua/room_claim.lua has its fields)
-- ARGV[1] n; then n quintuples: queue, room, room bytes ("" for no bytes
-- limit), claimed at the round's start, claimed bytes at the round's start;
-- then the queues to forget. The room is what gearmand's count left, less
-- what workers claimed since the round started (those copies may not be in
-- that count yet: counting them twice refuses early, never late). A queue
-- to forget (no longer reject-publish, or gone) loses its room fields; one
-- not named at all keeps them: its subscription may be newer than the
-- round's read of the subscriptions (the warden names only queues whose
-- room it saw before that read).
local n = tonumber(ARGV[1])
for i = 2, 5 * n + 1, 5 do
  local queue = ARGV[i]
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
for i = 5 * n + 2, #ARGV do
  local queue = ARGV[i]
  redis.call('HDEL', KEYS[1], queue, queue .. ' bytes', queue .. ' claimed',
             queue .. ' claimed-bytes')
end
return n
