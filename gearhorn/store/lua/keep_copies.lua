-- Write the records of held copies of one queue (gearhorn/store/heldcopies.py).
-- KEYS[1] <p>copies:{Q}
-- ARGV[1] "new" (a fanout's copies) or "again" (handed over to a new holder)
-- ARGV[2..] four per copy: its field, the record's head (holder NUL
--         precedence NUL), the generation asked for, the record's tail (NUL
--         unique NUL body)
-- Returns, per copy, the generation written, or -1 when none was.
-- A record already there was handed out (or was about to be) under its
-- generation: the copy takes the next one. gearmand never runs a job whose
-- holder left, nor one attached to it under the same unique, so a fanout
-- run again after its worker died must not reuse the unique; and it must
-- hand its copies, since the run before may have written them and failed
-- before handing any. With "again", a record that is gone (answered
-- meanwhile) stays forgotten.
local again = ARGV[1] == 'again'
local written = {}
for i = 2, #ARGV, 4 do
  local generation = tonumber(ARGV[i + 2])
  local field, head, tail = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  -- a new copy (the common case): one command
  if again or redis.call('HSETNX', KEYS[1], field, head .. generation .. tail) == 0 then
    local old = redis.call('HGET', KEYS[1], field)
    if old then
      local was = tonumber(string.match(old, '^[^%z]*%z[^%z]*%z(%d+)%z'))
      if was and was >= generation then
        generation = was + 1
      end
      redis.call('HSET', KEYS[1], field, head .. generation .. tail)
    else
      generation = -1  -- again: answered meanwhile
    end
  end
  written[#written + 1] = generation
end
return written
