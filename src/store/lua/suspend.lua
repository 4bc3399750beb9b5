-- --suspend: mark KEY suspended, fleet-wide, until --resume (or, with --for, until a time).
-- KEYS[1] the suspension (hash: 'current', the record while suspended; 'pauses', the past ones)
-- ARGV[1] the record (JSON: host, user, reason); 'since' is set here from Redis's clock, and
-- kept when KEY was suspended already (who is replaced, and the reason when one is given)
-- ARGV[2] --for in ms (0: until --resume): 'until' is set to Redis's clock plus it (and a
-- suspension again without --for has none)
-- Returns {the record before (false when it was not suspended), the record now}.
local before = suspension_in_force(KEYS[1], true)
local record = cjson.decode(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
record.since = now
local span = tonumber(ARGV[2]) or 0
if span > 0 then
  record['until'] = now + span
end
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
