-- --trigger: ask the fleet to run KEY once now, as a manual instant.
-- KEYS[1] the trigger requests (hash: instant -> JSON record), KEYS[2] the ledger of instants
-- ARGV[1] the instant (Unix ms, the asking host's clock: a label), ARGV[2] the record (JSON:
-- host, user, reason), ARGV[3] how long the requests are kept (ms)
-- Writes the record with 'asked' (Redis's clock) and 'state' 'asked', unless the instant is
-- taken already (a request or a ledger entry): then writes nothing and returns 0. Else 1. The
-- oldest requests beyond the 64 newest are trimmed.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local field = ARGV[1]
if not tonumber(field) then
  return redis.error_reply('ERR the instant is not a number')
end
if redis.call('HEXISTS', KEYS[1], field) == 1 or redis.call('HEXISTS', KEYS[2], field) == 1 then
  return 0
end
local record = cjson.decode(ARGV[2])
local t = redis.call('TIME')
record.asked = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
record.state = 'asked'
redis.call('HSET', KEYS[1], field, cjson.encode(record))
-- The requests are bounded as the ledger is: the 64 newest (newest.lua, prepended).
keep_newest(KEYS[1], 64, 16, field)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
