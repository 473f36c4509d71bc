-- Take the messages that are due, each by one caller only.
-- ARGV[1] most messages to take
-- ARGV[2] lease, milliseconds
-- ARGV[3] shard width, milliseconds
-- ARGV[4] key prefix
-- ARGV[5] most shards to look at in one call
-- Returns the due messages. Each stays in its shard with its score moved to
-- now + lease: the caller removes it (ZREM) once its copies are queued; if
-- the caller dies first, the message is due again when the lease ends and
-- another worker sends it (its copies keep their unique keys, so gearmand
-- coalesces those still queued). The cursor moves past shards that are
-- empty and wholly in the past.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local width = tonumber(ARGV[3])
local cursor_key = ARGV[4] .. 'due:cursor'
local cursor = tonumber(redis.call('GET', cursor_key))
if cursor == nil then return {} end
local current = math.floor(now / width)
local taken = {}
local shard = cursor
local looked = 0
while shard <= current and #taken < limit and looked < tonumber(ARGV[5]) do
  local key = ARGV[4] .. 'due:' .. shard
  local due = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, limit - #taken)
  for _, item in ipairs(due) do
    redis.call('ZADD', key, now + lease, item)
    taken[#taken + 1] = item
  end
  if shard == cursor and shard < current and redis.call('EXISTS', key) == 0 then
    cursor = shard + 1
  end
  shard = shard + 1
  looked = looked + 1
end
redis.call('SET', cursor_key, cursor)
return taken
