-- Write the records of held copies of one queue (gearhorn/store/heldcopies.py).
-- KEYS[1] <p>copies:{Q}
-- ARGV[1] "new" (a fanout's copies) or "again" (handed over to a new holder)
-- ARGV[2..] four per copy: its field, the record's head (holder NUL
--         precedence NUL), the generation asked for, the record's tail (NUL
--         unique NUL body)
-- Returns, per copy, the generation written, or -1 when none was:
-- - new: a record already there means the copy is held already (a retry of
--   its fanout, or a replay after its worker died): its holder, or whoever
--   takes over from it, hands it. Handing it again would deliver it twice,
--   where gearmand coalesced such copies, and under the same unique it
--   would attach to a dead holder's job, which gearmand never runs. (A
--   holder whose write failed half-way hands those copies itself later.)
-- - again: only records still there (one answered meanwhile stays
--   forgotten), each at a generation above the one it was handed under.
local again = ARGV[1] == 'again'
local written = {}
for i = 2, #ARGV, 4 do
  local generation = tonumber(ARGV[i + 2])
  local field, head, tail = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  if not again then  -- the common case: one command
    if redis.call('HSETNX', KEYS[1], field, head .. generation .. tail) == 0 then
      generation = -1
    end
  else
    local old = redis.call('HGET', KEYS[1], field)
    if old then
      local was = tonumber(string.match(old, '^[^%z]*%z[^%z]*%z(%d+)%z'))
      if was and was >= generation then
        generation = was + 1
      end
      redis.call('HSET', KEYS[1], field, head .. generation .. tail)
    else
      generation = -1
    end
  end
  written[#written + 1] = generation
end
return written
