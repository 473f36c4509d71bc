-- Count one more hand-out of each message a bridge grabbed, and forget the
-- messages acknowledged since its last call (gearhorn/store/redeliveries.py).
-- KEYS[1] <p>handouts:<function>
-- ARGV[1] how long the hash lives after this, milliseconds
-- ARGV[2] n, the number of acknowledged messages that follow
-- ARGV[3..2+n] their unique keys (deleted)
-- ARGV[3+n..] the unique keys of the messages grabbed now
-- Returns, per message grabbed, 1 if some bridge had handed it out before,
-- else 0. One call per grab, forgetting included: a pipeline of HINCRBYs
-- and an HDEL per batch of acks cost the bridge a third of its queue
-- throughput (bench/stomp_load.py).
local settled = tonumber(ARGV[2])
for i = 3, 2 + settled do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
local before = {}
for i = 3 + settled, #ARGV do
  before[#before + 1] = (redis.call('HINCRBY', KEYS[1], ARGV[i], 1) > 1) and 1 or 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return before
