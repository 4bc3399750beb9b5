-- Take the lock and advance its fencing counter, atomically.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] this attempt's "abandoned" marker,
-- KEYS[4] the schedule record (hash: instant, schedule), KEYS[5] the --limit record (present while
-- holders with a --limit above 1 hold the KEY: then this --limit 1 attempt is a mismatch)
-- ARGV[1] holder value, ARGV[2] ttl in ms, ARGV[3] the --schedule ('' without one),
-- ARGV[4...] with a schedule: its instants around the client's clock, in Unix ms
-- Returns {fencing token (a decimal string), 0, false, instant, 0} when taken, {0, ms until the holder's lock expires,
-- holder value, instant, 0} when held (waiters use it to sleep no longer than the holder's expiry;
-- -v names the holder), and {0, 0, false, instant, recorded instant} when the run for that
-- instant already started. The instant is the candidate nearest to Redis's clock (0: no schedule).
-- Every reply has two more elements, as semaphore.lua's: the slot (0 when taken, else -1) and the
-- current holders' --limit when it is not 1 (then nothing was touched), else 0.
-- The GETs come first so a key of the wrong type fails before anything is written
-- (a script that errors half-way is not rolled back).
--
-- The token is max(stored + 1, Redis's TIME in microseconds), exactly (fence.lua, prepended):
-- strictly increasing for the KEY even when Redis lost the counter (restart without persistence,
-- FLUSHALL, eviction, a failover to a replica that missed the last write), as long as Redis's
-- clock does not go back.
-- Redis < 5 needs effects replication to write after TIME; Redis 7 always does it.
if redis.replicate_commands then pcall(redis.replicate_commands) end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- The client gave up on this attempt (its reply was lost) and asked for it to be undone.
  return {0, 0, false, 0, 0, -1, 0}
end
local limit = tonumber(redis.call('GET', KEYS[5]) or '0')
if limit and limit > 1 then
  return {0, 0, false, 0, 0, -1, limit}
end
local instant = 0
if ARGV[3] ~= '' then
  -- The run belongs to the scheduled instant nearest to Redis's clock, whatever the hosts' clocks.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for i = 4, #ARGV do
    local c = tonumber(ARGV[i])
    if instant == 0 or math.abs(c - now) < math.abs(instant - now) then
      instant = c
    end
  end
  local ran = tonumber(redis.call('HGET', KEYS[4], 'instant'))
  if ran and ran >= instant then
    return {0, 0, false, instant, ran, -1, 0}
  end
end
local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, redis.call('PTTL', KEYS[1]), holder, instant, 0, -1, 0}
end
-- The token first: a counter that cannot give one refuses before anything is written.
local token, refused = fence_token(KEYS[2])
if not token then
  return refused
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1]), instant, 0, -1, 0}
end
if instant ~= 0 then
  redis.call('HSET', KEYS[4], 'instant', string.format('%d', instant), 'schedule', ARGV[3])
end
redis.call('SET', KEYS[2], token)
-- The token as a decimal string: a Lua number would round it above 2^53.
return {token, 0, false, instant, 0, 0, 0}
