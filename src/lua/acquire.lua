-- Take the lock and bump its fencing counter, atomically.
-- KEYS[1] lock, KEYS[2] fencing counter; ARGV[1] holder value, ARGV[2] ttl in ms.
-- Returns {fencing token, 0} when taken, {0, ms until the holder's lock expires} when held
-- (waiters use it to sleep no longer than the holder's expiry).
-- The GETs come first so a key of the wrong type fails before anything is written
-- (a script that errors half-way is not rolled back).
if redis.call('GET', KEYS[1]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence = redis.call('GET', KEYS[2])
if fence and not string.match(fence, '^%d+$') then
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' is not an integer')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
return {redis.call('INCR', KEYS[2]), 0}
