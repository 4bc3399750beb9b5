-- Release the lock only while it is still ours, then record the run.
-- KEYS[1] lock, KEYS[2] last-run record, KEYS[3] run history list, KEYS[4] waiter notifications
-- ARGV[1] our holder value
-- ARGV[2] min-hold left in ms: > 0 keeps the lock that much longer instead of deleting it
-- ARGV[3] run record (JSON), '' for none
-- ARGV[4] history length (0: keep only the last run)
-- ARGV[5] record expiry in ms (0: none)
-- ARGV[6] notification expiry in ms
-- With --limit above 1 (KEYS[1] is then our slot): KEYS[5] the limit record, KEYS[6...] every
-- slot; the record goes with the last slot, and lives at least as long as a slot kept for min-hold.
-- Returns 1 deleted, 2 kept for min-hold, 0 not ours (touched nothing of the lock).
-- The lock is dealt with first: if a record key has a wrong type, the release has still happened.
local result = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local hold = tonumber(ARGV[2])
  if hold > 0 then
    redis.call('PEXPIRE', KEYS[1], hold)
    if KEYS[5] and redis.call('PTTL', KEYS[5]) < hold then
      redis.call('PEXPIRE', KEYS[5], hold)
    end
    result = 2
  else
    redis.call('DEL', KEYS[1])
    if KEYS[5] then
      local any = false
      for i = 6, #KEYS do
        if redis.call('EXISTS', KEYS[i]) == 1 then any = true end
      end
      if not any then redis.call('DEL', KEYS[5]) end
    end
    -- Wake one waiter (BLPOP); the list never holds more than one element.
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], '1')
    redis.call('PEXPIRE', KEYS[4], ARGV[6])
    result = 1
  end
end
if ARGV[3] ~= '' then
  local ttl = tonumber(ARGV[5])
  if ttl > 0 then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl)
  else
    redis.call('SET', KEYS[2], ARGV[3])
  end
  local n = tonumber(ARGV[4])
  if n > 0 then
    redis.call('LPUSH', KEYS[3], ARGV[3])
    redis.call('LTRIM', KEYS[3], 0, n - 1)
    if ttl > 0 then
      redis.call('PEXPIRE', KEYS[3], ttl)
    else
      redis.call('PERSIST', KEYS[3])
    end
  else
    -- --history 0 keeps no list: trim away what earlier runs kept.
    redis.call('DEL', KEYS[3])
  end
end
return result
