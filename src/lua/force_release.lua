-- Delete a lock whoever holds it, and wake a waiter. Used by operators for a stuck lock; the
-- holder's watchdog then sees "not ours" and stops its command.
-- KEYS[1] lock, KEYS[2] waiter notifications; ARGV[1] notification expiry in ms.
-- Returns the holder value that was deleted, or false when the lock was free.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return false
end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], '1')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return holder
