-- Extend the lock only while it is still ours (compare-and-PEXPIRE).
-- KEYS[1] lock; ARGV[1] our holder value, ARGV[2] ttl in ms. Returns 1 if ours, 0 if not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
