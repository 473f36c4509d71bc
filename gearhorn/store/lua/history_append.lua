-- Append a fanout's messages to their topic's history.
-- KEYS[1] the history stream (<p>history:{T})
-- KEYS[2] its offset and epoch (<p>history-meta:{T}, a hash); same slot
-- KEYS[3] the workers' recent message ids (<p>history-ids:{T}, a sorted
--         set: message id -> when, in ms by Redis's clock); same slot
-- ARGV[1] history_size (MAXLEN ~), ARGV[2] history_ttl (seconds),
-- ARGV[3] an epoch to take if the topic has none, ARGV[4] now (ms),
-- ARGV[5] '0': the call as a whole once; else each message once within
-- that many ms, ARGV[6] ids kept at most, ARGV[7] '1': a real-time topic's
-- history, kept only while it has readers (lua/history_readers.lua): with
-- no epoch (none read it lately) nothing is appended,
-- then message id, payload and headers (JSON, or "" for none), triples,
-- in order.
-- An entry's stream id is "<offset>-1": offsets count per topic from 1, so
-- the id is the offset and XRANGE reads from one. A topic whose offset was
-- lost (expired, or Redis wiped) starts again at 1 with a new epoch, and
-- what was left of its stream goes: its offsets belong to the old epoch.
-- Nothing is appended twice:
-- - each message once (the workers' fanouts): a group of fanouts run again
--   after gearmand failed them may come back in other company, after other
--   appends; a message whose id was appended within the window is skipped.
-- - the call once (a bridge's SENDs, new ids each time): only the same call
--   can come again (the look-up it rode with failed); the hash keeps the
--   first message id of the last call, 'mid'.
-- Returns {epoch, first offset appended, last offset appended} ({epoch, 0,
-- 0} when nothing was; {'', 0, 0} for a real-time topic nobody reads).
local FIRST = 8
local epoch = redis.call('HGET', KEYS[2], 'epoch')
local window = tonumber(ARGV[5])
local while_read = ARGV[7] == '1'
if not epoch and while_read then
  return {'', 0, 0}
elseif not epoch then
  epoch = ARGV[3]
  redis.call('DEL', KEYS[1], KEYS[3])
  redis.call('HSET', KEYS[2], 'epoch', epoch)
elseif window == 0 and redis.call('HGET', KEYS[2], 'mid') == ARGV[FIRST] then
  return {epoch, 0, 0}
end
local new = {}
local now = 0  -- Redis's clock, not the callers': their clocks may differ
if window > 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local ids = {}
  for at = FIRST, #ARGV, 3 do
    ids[#ids + 1] = ARGV[at]
  end
  for from = 1, #ids, 1000 do  -- unpack's stack is bounded
    local upto = math.min(from + 999, #ids)
    local seen = redis.call('ZMSCORE', KEYS[3], unpack(ids, from, upto))
    for i = from, upto do
      if not seen[i - from + 1] then
        new[#new + 1] = FIRST + 3 * (i - 1)
      end
    end
  end
else
  redis.call('HSET', KEYS[2], 'mid', ARGV[FIRST])
  for at = FIRST, #ARGV, 3 do
    new[#new + 1] = at
  end
end
if #new == 0 then
  return {epoch, 0, 0}
end
local last = redis.call('HINCRBY', KEYS[2], 'offset', #new)
local first = last - #new + 1
for i, at in ipairs(new) do
  local offset = first + i - 1
  if ARGV[at + 2] == '' then
    redis.call('XADD', KEYS[1], offset .. '-1', 'm', ARGV[at], 'p', ARGV[at + 1],
               't', ARGV[4])
  else
    redis.call('XADD', KEYS[1], offset .. '-1', 'm', ARGV[at], 'p', ARGV[at + 1],
               't', ARGV[4], 'h', ARGV[at + 2])
  end
  if window > 0 then
    redis.call('ZADD', KEYS[3], now, ARGV[at])
  end
end
if while_read then
  -- Exact, so the memory a real-time topic may take is bounded; and what
  -- is older than its ttl goes too, a few of the oldest per call (each
  -- goes once), so a slow topic keeps minutes, not its size.
  redis.call('XTRIM', KEYS[1], 'MAXLEN', ARGV[1])
  local cutoff = tonumber(ARGV[4]) - tonumber(ARGV[2]) * 1000
  for _ = 1, 16 do
    local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
    if not oldest then break end
    local fields, at = oldest[2], nil
    for i = 1, #fields, 2 do
      if fields[i] == 't' then at = tonumber(fields[i + 1]) end
    end
    if not at or at >= cutoff then break end
    redis.call('XDEL', KEYS[1], oldest[1])
  end
else
  redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[1])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if tonumber(redis.call('HGET', KEYS[2], 'readers') or '0') > 0 then
  redis.call('PERSIST', KEYS[2])  -- kept while read (lua/history_readers.lua)
elseif not while_read then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end  -- else it lingers for what history_readers.lua set when the last left
if window > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[6]) - 1)
  redis.call('PEXPIRE', KEYS[3], window)
end
return {epoch, first, last}
