-- Holders' leases, by Redis's clock (docs/design/held-copies.rst;
-- gearhorn/store/holders.py).
-- KEYS[1] {<p>holders}   holder -> its lease's end (Redis ms); 0: listed by
--                        a write of a holder never registered; -1: fenced
-- KEYS[2] {<p>holders}:<H>, the index of ARGV[2] (mode drop only)
-- ARGV[1] the mode, ARGV[2] the holder; then, by mode:
--   register  the lease (ms). A new name only: returns 0 if it was taken.
--   renew     the lease (ms). Returns the milliseconds since the lease's
--             previous renewal (or registration), by Redis's clock; -1
--             when the holder is fenced (or was never registered).
--   judge     (nothing) Fences every holder whose lease ended before now,
--             if the judge's own has not (else returns -1: it renews
--             first). Returns the fenced holders (those still listed).
--   retire    (nothing) A clean stop: the holder fences itself.
--   drop      (nothing) A fenced holder whose index is empty is forgotten.
--   others    (nothing) How many other holders' leases run now.
local mode, holder = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if mode == 'register' then
  return redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[3]), holder)
elseif mode == 'renew' then
  local lease = tonumber(ARGV[3])
  local ends = tonumber(redis.call('ZSCORE', KEYS[1], holder))
  if not ends or ends <= 0 then return -1 end
  redis.call('ZADD', KEYS[1], 'XX', now + lease, holder)
  return math.max(0, now - (ends - lease))
elseif mode == 'judge' then
  local own = tonumber(redis.call('ZSCORE', KEYS[1], holder))
  if not own or own < now then return -1 end
  for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], 0, '(' .. now)) do
    redis.call('ZADD', KEYS[1], -1, dead)
  end
  return redis.call('ZRANGEBYSCORE', KEYS[1], -1, -1)
elseif mode == 'retire' then
  return redis.call('ZADD', KEYS[1], 'XX', -1, holder)
elseif mode == 'others' then
  local alive = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  local own = tonumber(redis.call('ZSCORE', KEYS[1], holder))
  if own and own > now then alive = alive - 1 end
  return alive
elseif mode == 'drop' then
  if tonumber(redis.call('ZSCORE', KEYS[1], holder)) == -1
      and redis.call('EXISTS', KEYS[2]) == 0 then
    return redis.call('ZREM', KEYS[1], holder)
  end
  return 0
end
return redis.error_reply('unknown mode ' .. tostring(mode))
