-- Append a fanout's messages to their topic's history.
-- KEYS[1] the history stream (<p>history:{T})
-- KEYS[2] its offset and epoch (<p>history-meta:{T}, a hash); same slot
-- ARGV[1] history_size (MAXLEN ~), ARGV[2] history_ttl (seconds),
-- ARGV[3] an epoch to take if the topic has none, ARGV[4] now (ms),
-- then message id, payload and headers (JSON, or "" for none), triples,
-- in order.
-- An entry's stream id is "<offset>-1": offsets count per topic from 1, so
-- the id is the offset and XRANGE reads from one. A topic whose offset was
-- lost (expired, or Redis wiped) starts again at 1 with a new epoch, and
-- what was left of its stream goes: its offsets belong to the old epoch.
-- The same call again (a group of fanouts run again after gearmand failed
-- them, or after the look-up it rode with failed) appends nothing: the
-- hash keeps the first message id of the last call, 'mid'.
-- Returns {epoch, first offset appended, last offset appended} ({epoch, 0,
-- 0} for a call made again).
local epoch = redis.call('HGET', KEYS[2], 'epoch')
if not epoch then
  epoch = ARGV[3]
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'epoch', epoch)
elseif redis.call('HGET', KEYS[2], 'mid') == ARGV[5] then
  return {epoch, 0, 0}
end
local n = (#ARGV - 4) / 3
redis.call('HSET', KEYS[2], 'mid', ARGV[5])
local last = redis.call('HINCRBY', KEYS[2], 'offset', n)
local first = last - n + 1
for i = 0, n - 1 do
  local at = 5 + 3 * i
  if ARGV[at + 2] == '' then
    redis.call('XADD', KEYS[1], (first + i) .. '-1', 'm', ARGV[at], 'p', ARGV[at + 1],
               't', ARGV[4])
  else
    redis.call('XADD', KEYS[1], (first + i) .. '-1', 'm', ARGV[at], 'p', ARGV[at + 1],
               't', ARGV[4], 'h', ARGV[at + 2])
  end
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {epoch, first, last}
