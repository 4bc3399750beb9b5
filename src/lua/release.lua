-- Release the lock only while it is still ours (compare-and-delete).
-- KEYS[1] lock; ARGV[1] our holder value. Returns 1 if deleted, 0 if it was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
