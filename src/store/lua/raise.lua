-- Raise the fencing counter to the token a quorum agreed on, only while the lock is still ours.
-- KEYS[1] lock, KEYS[2] fencing counter; ARGV[1] our holder value, ARGV[2] the token.
-- Returns 1 when the counter is now at least the token, 0 when the lock is not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local stored, refused = fence_read(KEYS[2])
if not stored then
  return refused
end
if fence_less(stored, ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
