-- Read everything about one lock at one instant.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] last-run record.
-- Returns {holder value or false, PTTL, fencing counter or false, last-run record or false}.
return {
  redis.call('GET', KEYS[1]),
  redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]),
  redis.call('GET', KEYS[3]),
}
