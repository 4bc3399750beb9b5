-- Read everything about one lock at one instant.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] last-run record, KEYS[4] run history,
-- KEYS[5] schedule record
-- ARGV[1] how many history records to return (0: none)
-- Returns {holder value or false, PTTL, fencing counter or false, last-run record or false,
-- the newest ARGV[1] history records, {recorded instant, schedule} (false when none)}.
local n = tonumber(ARGV[1])
local history = {}
if n > 0 then
  history = redis.call('LRANGE', KEYS[4], 0, n - 1)
end
return {
  redis.call('GET', KEYS[1]),
  redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]),
  redis.call('GET', KEYS[3]),
  history,
  redis.call('HMGET', KEYS[5], 'instant', 'schedule'),
}
