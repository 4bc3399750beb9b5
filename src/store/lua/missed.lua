-- An instant that could not start in time (no replica had room before its period or its
-- --catch-up window ended, or Redis could not be asked): recorded in the ledger as 'missed' with
-- a reason ('skipped' while KEY is suspended), unless the ledger already has it (an attempt ran,
-- or someone recorded it). Returns 1 when it wrote the entry.
-- KEYS[1] the ledger, KEYS[2] the suspension; ARGV[1] the instant
-- (Unix ms), ARGV[2] the reason (a word: letters and underscores)
local field = ARGV[1]
if not tonumber(field) then
  return redis.error_reply('ERR the instant is not a number')
end
local reason = ARGV[2] or ''
if not string.match(reason, '^[a-z_]*$') then
  return redis.error_reply('ERR the reason is not a word')
end
if redis.call('HEXISTS', KEYS[1], field) == 1 then
  return 0
end
if suspension_in_force(KEYS[2], true) then
  redis.call('HSET', KEYS[1], field, '{"state":"skipped","attempts":{}}')
  return 1
end
if reason == '' then
  redis.call('HSET', KEYS[1], field, '{"state":"missed","attempts":{}}')
else
  redis.call('HSET', KEYS[1], field, '{"state":"missed","reason":"' .. reason .. '","attempts":{}}')
end
return 1
