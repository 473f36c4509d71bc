-- Keep a delayed message until it is due.
-- ARGV[1] due time, epoch milliseconds
-- ARGV[2] the message (a DelayedItem as JSON, unique by its message id)
-- ARGV[3] shard width, milliseconds
-- ARGV[4] key prefix
-- Returns 0 when the message is already due by Redis's clock (the caller
-- sends it now), else 1. Writes <p>due:<shard>, one sorted set per shard of
-- time, so messages due at different times land on different keys, and
-- lowers <p>due:cursor (the oldest shard that may hold messages) if needed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = tonumber(ARGV[1])
if due <= now then return 0 end
local shard = math.floor(due / tonumber(ARGV[3]))
redis.call('ZADD', ARGV[4] .. 'due:' .. shard, due, ARGV[2])
local cursor_key = ARGV[4] .. 'due:cursor'
local cursor = tonumber(redis.call('GET', cursor_key))
if cursor == nil or shard < cursor then redis.call('SET', cursor_key, shard) end
return 1
