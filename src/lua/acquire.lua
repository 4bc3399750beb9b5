-- Take the lock and bump its fencing counter, atomically.
-- KEYS[1] lock, KEYS[2] fencing counter; ARGV[1] holder value, ARGV[2] ttl in ms.
-- Returns the new fencing token (>= 1), or 0 when the lock is held.
-- The GETs come first so a key of the wrong type fails before anything is written
-- (a script that errors half-way is not rolled back).
if redis.call('GET', KEYS[1]) then
  return 0
end
local fence = redis.call('GET', KEYS[2])
if fence and not string.match(fence, '^%d+$') then
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' is not an integer')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
return redis.call('INCR', KEYS[2])
