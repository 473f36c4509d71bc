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
-- ARGV[8] the caller's id when it asks for the topic's pen or writes with
-- it (a bridge), else '', ARGV[9] the first offset the caller already gave
-- these messages with its pen ('0': none; '-1': the caller's pen broke,
-- offsets it gave may not be written), ARGV[10] ms a pen is granted for
-- ('0': not asked),
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
-- The pen (docs/design/realtime.rst, "Offsets given by the bridge"): the one caller
-- that may give a topic's next offsets itself, before they are written
-- ('pen', 'pen_until' in the meta hash). Another caller is refused while
-- it is held (first -1: try again shortly) and marks it 'wanted'; the
-- holder hears so in its next reply, writes what it gave, and gives it
-- back (lua/history_pen.lua), and for a while none is granted ('calm_until').
-- A pen that lapsed unreturned may have given offsets never written: the
-- next caller starts a new epoch, so no reader takes another message for
-- one it had (x-recovered:false instead).
-- Returns {epoch, first offset appended, last offset appended, pen} ({epoch,
-- 0, 0} when nothing was; {'', 0, 0} for a real-time topic nobody reads;
-- first -1: refused, another holds the pen; -2: the caller's pen was lost,
-- nothing appended); pen: 'held' (the caller holds it now), 'wanted'
-- (it holds it and another waits) or ''.
local FIRST = 11
local meta = KEYS[2]
local caller, given, pen_ms = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local epoch = redis.call('HGET', meta, 'epoch')
local window = tonumber(ARGV[5])
local while_read = ARGV[7] == '1'
local function new_epoch()
  -- What is left of an old epoch's stream is not this epoch's.
  epoch = ARGV[3]
  redis.call('DEL', KEYS[1], KEYS[3])
  redis.call('HDEL', meta, 'offset', 'mid', 'pen', 'pen_until', 'wanted')
  redis.call('HSET', meta, 'epoch', epoch)
end
if not epoch and while_read then
  return {'', 0, 0, ''}
elseif not epoch then
  new_epoch()
elseif window == 0 and redis.call('HGET', meta, 'mid') == ARGV[FIRST] then
  return {epoch, 0, 0, ''}
end
local clock = redis.call('TIME')  -- Redis's clock, not the callers': theirs may differ
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local holder = redis.call('HGET', meta, 'pen')
if holder and holder ~= caller then
  if now < tonumber(redis.call('HGET', meta, 'pen_until') or '0') then
    redis.call('HSET', meta, 'wanted', '1')
    return {epoch, -1, 0, ''}
  end
  new_epoch()  -- lapsed unreturned: what it gave may never be written
  holder = nil
end
if holder == caller and given == -1 then
  new_epoch()  -- the caller's writes failed after it gave their offsets
  holder = nil
elseif given > 0 and (holder ~= caller
                      or given ~= tonumber(redis.call('HGET', meta, 'offset') or '0') + 1) then
  return {epoch, -2, 0, ''}
end
local pen = ''
if caller ~= '' and pen_ms > 0 then
  if redis.call('HGET', meta, 'wanted') then
    if holder == caller then pen = 'wanted' end
  elseif holder == caller
      or now >= tonumber(redis.call('HGET', meta, 'calm_until') or '0') then
    redis.call('HSET', meta, 'pen', caller, 'pen_until', now + pen_ms)
    pen = 'held'
  end
end
local new = {}
if window > 0 then
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
  redis.call('HSET', meta, 'mid', ARGV[FIRST])
  for at = FIRST, #ARGV, 3 do
    new[#new + 1] = at
  end
end
if #new == 0 then
  return {epoch, 0, 0, pen}
end
local last = redis.call('HINCRBY', meta, 'offset', #new)
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
if tonumber(redis.call('HGET', meta, 'readers') or '0') > 0 then
  redis.call('PERSIST', meta)  -- kept while read (lua/history_readers.lua)
elseif not while_read then
  redis.call('EXPIRE', meta, ARGV[2])
end  -- else it lingers for what history_readers.lua set when the last left
if window > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[6]) - 1)
  redis.call('PEXPIRE', KEYS[3], window)
end
return {epoch, first, last, pen}
