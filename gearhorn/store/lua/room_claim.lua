-- Claim room in reject-publish queues for a fanout's copies, message by
-- message, as RabbitMQ admits a queue's messages until it is full.
-- KEYS[1] <p>room (a hash): "<queue>" -> copies it may still take,
--         "<queue> bytes" -> payload bytes it may still take (absent: no
--         limit of that kind), "<queue> claimed" / "<queue> claimed-bytes"
--         -> what workers claimed ever (the warden subtracts what was
--         claimed during its round, lua/room_set.lua)
-- ARGV[1] the number of messages n, ARGV[2..n+1] their sizes in bytes, in
-- order; then the queues.
-- Returns, per queue in order, how many of the messages (the first ones) it
-- takes. A queue with no room field (not reject-publish to the warden yet)
-- takes them all.
local n = tonumber(ARGV[1])
local taken = {}
for q = n + 2, #ARGV do
  local queue = ARGV[q]
  local room = tonumber(redis.call('HGET', KEYS[1], queue) or '-1')
  local room_bytes = tonumber(redis.call('HGET', KEYS[1], queue .. ' bytes') or '-1')
  local k, bytes = 0, 0
  while k < n do
    local size = tonumber(ARGV[k + 2])
    if (room >= 0 and k + 1 > room) or (room_bytes >= 0 and bytes + size > room_bytes) then
      break
    end
    k, bytes = k + 1, bytes + size
  end
  if k > 0 then
    if room >= 0 then redis.call('HINCRBY', KEYS[1], queue, -k) end
    if room_bytes >= 0 then redis.call('HINCRBY', KEYS[1], queue .. ' bytes', -bytes) end
    redis.call('HINCRBY', KEYS[1], queue .. ' claimed', k)
    redis.call('HINCRBY', KEYS[1], queue .. ' claimed-bytes', bytes)
  end
  taken[#taken + 1] = k
end
return taken
