-- Keep a delayed message until it is due.
-- KEYS[1] the message's time shard (<p>due:<shard>), a sorted set by due time
-- KEYS[2] the cursor (<p>due:cursor): the oldest shard that may hold messages
-- ARGV[1] due time, epoch milliseconds
-- ARGV[2] the message (a DelayedItem as JSON, unique by its message id)
-- ARGV[3] the shard's number (due time // shard width)
-- ARGV[4] the matchmaking channel
-- Returns 0 when the message is already due by Redis's clock (the caller
-- sends it now), else 1. Messages due at different times land on different
-- keys; the cursor is lowered to this shard if it was past it. When the
-- message is the first due in its shard, the workers are told in how many
-- milliseconds ({"op":"due","in_ms":N}): a releaser sleeps until the first
-- due time it knows of (lua/release.lua), so one that is earlier must wake
-- it. A later one in the same shard is found when the first is released.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = tonumber(ARGV[1])
if due < now then return 0 end  -- (ARGV[1] is rounded down: see release.lua)
local shard = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], due, ARGV[2])
local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if first[1] == ARGV[2] then
  redis.call('PUBLISH', ARGV[4], '{"op":"due","in_ms":' .. (due + 1 - now) .. '}')
end
local cursor = tonumber(redis.call('GET', KEYS[2]))
if cursor == nil or shard < cursor then redis.call('SET', KEYS[2], shard) end
return 1
