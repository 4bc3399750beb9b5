-- --suspend: mark KEY suspended, fleet-wide, until --resume.
-- KEYS[1] the suspension (hash: 'current', the record while suspended; 'pauses', the past ones)
-- ARGV[1] the record (JSON: host, user, reason); 'since' is set here from Redis's clock, and
-- kept when KEY was suspended already (who is replaced, and the reason when one is given)
-- Returns {the record before (false when it was not suspended), the record now}.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local before = redis.call('HGET', KEYS[1], 'current')
local record = cjson.decode(ARGV[1])
local t = redis.call('TIME')
record.since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if before then
  local ok, old = pcall(cjson.decode, before)
  if ok and type(old) == 'table' and tonumber(old.since) then
    record.since = tonumber(old.since)
  end
  if ok and type(old) == 'table' and record.reason == '' and type(old.reason) == 'string' then
    record.reason = old.reason
  end
end
local now = cjson.encode(record)
redis.call('HSET', KEYS[1], 'current', now)
redis.call('PERSIST', KEYS[1])
return {before or false, now}
