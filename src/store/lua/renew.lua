-- Extend the lock only while it is still ours (compare-and-PEXPIRE).
-- KEYS[1] lock (or our slot, with --limit above 1); ARGV[1] our holder value, ARGV[2] ttl in ms.
-- With --limit above 1 also KEYS[2] the limit record and ARGV[3] N: kept alive as long as a slot.
-- Returns 1 if ours, 0 if not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if KEYS[2] and redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
  end
  return 1
end
return 0
