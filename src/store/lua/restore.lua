-- Several masters: write our lock back on a master that lost it (restarted empty) while a
-- majority still confirms it, so that a rolling restart cannot hand a majority to someone else.
-- Only where the lock is missing or already ours: another holder's lock is never touched.
-- KEYS[1] lock, KEYS[2] fencing counter; ARGV[1] our holder value, ARGV[2] ttl in ms,
-- ARGV[3] our fencing token. Returns 1 when the lock is ours there now, 0 when another holds it.
local holder = redis.call('GET', KEYS[1])
if holder ~= false and holder ~= ARGV[1] then
  return 0
end
local stored, refused = fence_read(KEYS[2])
if not stored then
  return refused
end
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if fence_less(stored, ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[3])
end
return 1
