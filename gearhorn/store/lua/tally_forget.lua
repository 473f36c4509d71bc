-- Forget a queue's oldest tally entries, judged consumed (gearhorn/store/tally.py).
-- KEYS[1] <p>tally:{Q}
-- KEYS[2] <p>tally:{Q}:sum
-- ARGV[1] their copies in all, ARGV[2] their bytes in all
-- ARGV[3..] the entries, as the warden read them, oldest first
-- Returns 1 when they were the head of the list and are forgotten, 0 when
-- they no longer were: a warden that lost its lease mid-round has forgotten
-- them already, and trimming again by count would take newer entries,
-- copies still queued, with them.
local n = #ARGV - 2
local head = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #head ~= n then return 0 end
for i = 1, n do
  if head[i] ~= ARGV[i + 2] then return 0 end
end
redis.call('LTRIM', KEYS[1], n, -1)
redis.call('HINCRBY', KEYS[2], 'c', -tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[2], 'b', -tonumber(ARGV[2]))
return 1
