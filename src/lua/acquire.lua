-- Take the lock and advance its fencing counter, atomically.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] this attempt's "abandoned" marker
-- ARGV[1] holder value, ARGV[2] ttl in ms
-- Returns {fencing token, 0, false} when taken, {0, ms until the holder's lock expires, holder value}
-- when held (waiters use it to sleep no longer than the holder's expiry; -v names the holder).
-- The GETs come first so a key of the wrong type fails before anything is written
-- (a script that errors half-way is not rolled back).
--
-- The token is max(stored + 1, Redis's TIME in microseconds): strictly increasing for the KEY even
-- when Redis lost the counter (restart without persistence, FLUSHALL, eviction, a failover to a
-- replica that missed the last write), as long as Redis's clock does not go back.
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- The client gave up on this attempt (its reply was lost) and asked for it to be undone.
  return {0, 0, false}
end
local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, redis.call('PTTL', KEYS[1]), holder}
end
local stored = redis.call('GET', KEYS[2])
if stored and not string.match(stored, '^%d+$') then
  return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ' is not an integer')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
end
-- Redis < 5 needs effects replication to write after TIME; Redis 7 always does it.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local token = math.max((tonumber(stored) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('SET', KEYS[2], string.format('%d', token))
return {token, 0, false}
