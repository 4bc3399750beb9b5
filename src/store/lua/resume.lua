-- --resume: end KEY's suspension. The time it lasted is kept (the 16 newest) so that an instant
-- that passed meanwhile is never run after it: acquire.lua records it 'skipped'.
-- KEYS[1] the suspension (hash, see suspend.lua)
-- Returns the record that was in force, or false when KEY was not suspended.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local KEEP = 16
-- (One whose --for ran out has ended already: suspension.lua, prepended.)
local current = suspension_in_force(KEYS[1], true)
if not current then
  return false
end
local raw = redis.call('HGET', KEYS[1], 'pauses')
local ok, pauses = true, {}
if raw then
  ok, pauses = pcall(cjson.decode, raw)
  if not ok or type(pauses) ~= 'table' then
    return redis.error_reply('ERR the pauses of ' .. KEYS[1] .. ' are not ones cronlock wrote (left as they are)')
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ok2, record = pcall(cjson.decode, current)
local since = now
if ok2 and type(record) == 'table' and tonumber(record.since) then
  since = tonumber(record.since)
end
pauses[#pauses + 1] = {since, now}
while #pauses > KEEP do table.remove(pauses, 1) end
redis.call('HSET', KEYS[1], 'pauses', cjson.encode(pauses))
redis.call('HDEL', KEYS[1], 'current')
return current
