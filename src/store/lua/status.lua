-- Read everything about one lock at one instant.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] last-run record, KEYS[4] run history,
-- KEYS[5] schedule record, KEYS[6] the --limit record, KEYS[7] the slots' fencing tokens (hash),
-- KEYS[8] the ledger of instants, KEYS[9] the suspension (hash), KEYS[10...] the slots a --limit
-- above 1 may use
-- ARGV[1] how many history records to return (0: none)
-- Returns {holder value or false, PTTL, fencing counter or false, last-run record or false,
-- the newest ARGV[1] history records, {recorded instant, schedule} (false when none),
-- the --limit record or false, {slot, holder value, PTTL, fencing token} for each held slot,
-- the ledger as {instant, entry, ...} (at most 64 instants), the suspension record or false}.
local n = tonumber(ARGV[1])
local history = {}
if n > 0 then
  history = redis.call('LRANGE', KEYS[4], 0, n - 1)
end
local slots = {}
for i = 10, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v then
    local fence = redis.call('HGET', KEYS[7], tostring(i - 10)) or '0'
    slots[#slots + 1] = {i - 10, v, redis.call('PTTL', KEYS[i]), fence}
  end
end
return {
  redis.call('GET', KEYS[1]),
  redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]),
  redis.call('GET', KEYS[3]),
  history,
  redis.call('HMGET', KEYS[5], 'instant', 'schedule'),
  redis.call('GET', KEYS[6]),
  slots,
  redis.call('HGETALL', KEYS[8]),
  -- (Not one whose --for ran out: suspension.lua, prepended; nothing is written here.)
  (suspension_in_force(KEYS[9], false)),
}
