-- Undo an acquisition whose reply was lost: the client does not know whether the acquire script
-- ran, and may be about to run, on the server.
-- KEYS[1] lock, KEYS[2] the attempt's "abandoned" marker; ARGV[1] holder value, ARGV[2] ttl in ms.
-- If the lock holds our value, delete it. Either way, leave the marker for a TTL, so an acquire
-- script of this attempt that runs later takes nothing.
-- Returns 1 when it deleted our lock, 0 otherwise.
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
