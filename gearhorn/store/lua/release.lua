-- Take the messages that are due, each by one caller only.
-- KEYS[1] the cursor (<p>due:cursor), as the caller read it
-- KEYS[2..] consecutive time shards (<p>due:<n>), from the cursor on
-- ARGV[1] most messages to take
-- ARGV[2] lease, milliseconds
-- ARGV[3] shard width, milliseconds
-- ARGV[4] the number of the shard in KEYS[2]
-- Returns {the due messages, milliseconds until the first message left in
-- these shards is due (leases included), or -1 when they are empty}. Each
-- due message stays in its shard with its score moved to
-- now + lease: the caller removes it (ZREM) once its copies are queued; if
-- the caller dies first, the message is due again when the lease ends and
-- another worker sends it (its copies keep their unique keys, so gearmand
-- coalesces those still queued). The cursor moves past shards that are
-- empty and wholly in the past; shards before it (another caller moved it
-- meanwhile) are empty and skipped.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local cursor = tonumber(redis.call('GET', KEYS[1]))
if cursor == nil then return {} end
local current = math.floor(now / tonumber(ARGV[3]))
local first = tonumber(ARGV[4])
local taken = {}
for i = 2, #KEYS do
  local shard = first + i - 2
  if shard > current or #taken >= limit then break end
  if shard >= cursor then
    -- Scores are due times in whole milliseconds, rounded down: one is due
    -- once that millisecond is over, never before its exact time.
    local due = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', '(' .. now, 'LIMIT', 0,
                           limit - #taken)
    for _, item in ipairs(due) do
      redis.call('ZADD', KEYS[i], now + lease, item)
      taken[#taken + 1] = item
    end
    if shard == cursor and shard < current and redis.call('EXISTS', KEYS[i]) == 0 then
      cursor = shard + 1
    end
  end
end
redis.call('SET', KEYS[1], cursor)
local next_in = -1
for i = 2, #KEYS do
  local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
  if first[2] then
    local wait = math.max(0, tonumber(first[2]) + 1 - now)
    if next_in < 0 or wait < next_in then next_in = wait end
  end
end
return {taken, next_in}
