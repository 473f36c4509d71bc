-- Renew a lease only while it is still the caller's, in one step: a GET
-- then a PEXPIRE would renew a lease another process took in between.
-- KEYS[1] the lease (<p>warden)
-- ARGV[1] the caller, ARGV[2] milliseconds
-- Returns 1 when renewed, 0 when the lease is not the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
