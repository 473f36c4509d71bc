-- The records of one queue's held copies, and who may write them
-- (docs/design/held-copies.rst; gearhorn/store/heldcopies.py).
-- KEYS[1] <p>copies:{Q}  field: the copy's key; value: owner NUL precedence
--                        NUL generation NUL unique NUL body
-- KEYS[2] <p>owners:{Q}  holder -> "0" (may hold copies of Q) or the Redis
--                        time (ms) it was fenced in Q: its writes are refused
-- ARGV[1] the mode, ARGV[2] the holder writing; then, by mode:
--   keep    four per copy: field, head (holder NUL precedence NUL), the
--           generation, tail (NUL unique NUL body). A record there already
--           stays as it is (a retried fanout's copy is held already), and
--           is -1, unless it is exactly this one: the same call may run
--           twice (a cluster client sends it again when the reply was lost
--           with a failed master), and what it wrote must still be handed.
--           Returns each copy's generation, -1 where none was written.
--   again   two per copy: field, the generation it was handed at. Only a
--           record still the writer's, still at that generation, goes to
--           the next one. Returns each new generation, or -1.
--   fence   the holders to fence in Q (none are live: judged by the
--           caller in {<p>holders}). Returns every holder fenced in Q.
--   take    four per copy: field, its owner (fenced in Q), the generation
--           read, the generation to write. The record becomes the
--           writer's. Returns each generation written, or -1.
--   forget  two per copy: field, the answered generation modulo 36^3 (as
--           the handed unique carries it). A record at that generation or
--           an older one goes (a lost write may have left it older); one
--           handed again since stays for its own answer. Returns how many.
-- keep, again and take reply the error FENCED when the writer is fenced in Q.
local mode, holder = ARGV[1], ARGV[2]
local copies, owners = KEYS[1], KEYS[2]

-- The writer may write in Q (and is listed as a holder there), unless fenced.
local function admitted()
  local state = redis.call('HGET', owners, holder)
  if not state then
    redis.call('HSET', owners, holder, '0')
  elseif state ~= '0' then
    return false
  end
  return true
end

if mode == 'keep' then  -- the common case first, with no more than it needs
  if not admitted() then return redis.error_reply('FENCED ' .. holder) end
  local written = {}
  for i = 3, #ARGV, 4 do
    local generation = tonumber(ARGV[i + 2])
    local record = ARGV[i + 1] .. generation .. ARGV[i + 3]
    if redis.call('HSETNX', copies, ARGV[i], record) == 0
        and redis.call('HGET', copies, ARGV[i]) ~= record then
      generation = -1
    end
    written[#written + 1] = generation
  end
  return written
end

local WRAP = 46656  -- 36^3: handed uniques carry three base-36 digits

if mode == 'forget' then
  local gone = 0
  for i = 3, #ARGV, 2 do
    local record = redis.call('HGET', copies, ARGV[i])
    if record then
      local generation = tonumber(string.match(record, '^[^%z]*%z[^%z]*%z(%d+)'))
      if (tonumber(ARGV[i + 1]) - generation) % WRAP < WRAP / 2 then
        gone = gone + redis.call('HDEL', copies, ARGV[i])
      end
    end
  end
  if redis.call('EXISTS', copies) == 0 then redis.call('DEL', owners) end
  return gone
end

local function fenced(who)
  local state = redis.call('HGET', owners, who)
  return state and state ~= '0'
end

if mode == 'fence' then
  local now = redis.call('TIME')
  local stamp = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
  for i = 3, #ARGV do
    if not fenced(ARGV[i]) then redis.call('HSET', owners, ARGV[i], stamp) end
  end
  local found, all = {}, redis.call('HGETALL', owners)
  for i = 1, #all, 2 do
    if all[i + 1] ~= '0' then found[#found + 1] = all[i] end
  end
  return found
end

-- owner, precedence, generation and where the rest (NUL unique NUL body) starts
local function parse(record)
  local a = string.find(record, '\0', 1, true)
  local b = string.find(record, '\0', a + 1, true)
  local c = string.find(record, '\0', b + 1, true)
  return string.sub(record, 1, a - 1), string.sub(record, a + 1, b - 1),
         tonumber(string.sub(record, b + 1, c - 1)), c
end

local function rewrite(field, record, owner, generation)
  local _, precedence, _, rest = parse(record)
  redis.call('HSET', copies, field,
             owner .. '\0' .. precedence .. '\0' .. generation .. string.sub(record, rest))
end

if not admitted() then return redis.error_reply('FENCED ' .. holder) end
local written = {}
if mode == 'again' then
  for i = 3, #ARGV, 2 do
    local record, generation = redis.call('HGET', copies, ARGV[i]), -1
    if record then
      local owner, _, was = parse(record)
      if owner == holder and was == tonumber(ARGV[i + 1]) then
        generation = was + 1
        rewrite(ARGV[i], record, holder, generation)
      end
    end
    written[#written + 1] = generation
  end
elseif mode == 'take' then
  for i = 3, #ARGV, 4 do
    local record, generation = redis.call('HGET', copies, ARGV[i]), -1
    if record and fenced(ARGV[i + 1]) then
      local owner, _, was = parse(record)
      if owner == ARGV[i + 1] and was == tonumber(ARGV[i + 2]) then
        generation = tonumber(ARGV[i + 3])
        rewrite(ARGV[i], record, holder, generation)
      end
    end
    written[#written + 1] = generation
  end
else
  return redis.error_reply('unknown mode ' .. tostring(mode))
end
return written
