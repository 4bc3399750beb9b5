-- Delete a lock whoever holds it, and wake a waiter. Used by operators for a stuck lock; the
-- holder's watchdog then sees "not ours" and stops its command.
-- KEYS[1] lock, KEYS[2] waiter notifications, KEYS[3] the --limit record, KEYS[4...] the slots a
-- --limit above 1 may use; ARGV[1] notification expiry in ms, ARGV[2] a holder's token ('' for
-- every holder).
-- Returns the holder values that were deleted (empty when none held it).
local deleted = {}
local function take(key)
  local holder = redis.call('GET', key)
  if not holder then return end
  if ARGV[2] ~= '' then
    local ok, v = pcall(cjson.decode, holder)
    if not ok or type(v) ~= 'table' or v['token'] ~= ARGV[2] then return end
  end
  redis.call('DEL', key)
  deleted[#deleted + 1] = holder
end
take(KEYS[1])
for i = 4, #KEYS do take(KEYS[i]) end
if #deleted == 0 then
  return deleted
end
local any = false
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then any = true end
end
if not any then redis.call('DEL', KEYS[3]) end
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], '1')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return deleted
