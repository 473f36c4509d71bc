-- Claim the takeover of a dead holder's copies, for one claimer at a time.
-- KEYS[1] the claim (<p>taking-over:<holder>)
-- ARGV[1] the claimer
-- ARGV[2] seconds the claim lasts (if the claimer dies, it ends)
-- ARGV[3] the claimer seen holding the claim and known dead, or ""
-- Returns 1 when ARGV[1] holds the claim now. A claim held by a claimer
-- known dead is taken from it: a process killed mid-takeover (a power cut)
-- must not keep the copies it was taking over waiting for its claim to
-- end; that it is dead is what ARGV[3] says, checked by the caller.
local current = redis.call('GET', KEYS[1])
if current == false or (ARGV[3] ~= '' and current == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  return 1
end
return 0
