-- An instant that could not start in time (no replica had room before its period or its
-- --catch-up window ended): recorded in the ledger as 'missed' ('skipped' while KEY is suspended),
-- unless the ledger already has it (an attempt ran, or someone recorded it). Returns 1 when it
-- wrote the entry.
-- KEYS[1] the ledger, KEYS[2] the suspension; ARGV[1] the instant (Unix ms)
local field = ARGV[1]
if not tonumber(field) then
  return redis.error_reply('ERR the instant is not a number')
end
if redis.call('HEXISTS', KEYS[1], field) == 1 then
  return 0
end
local state = 'missed'
if redis.call('HEXISTS', KEYS[2], 'current') == 1 then
  state = 'skipped'
end
redis.call('HSET', KEYS[1], field, '{"state":"' .. state .. '","attempts":{}}')
return 1
