-- --trigger that no replica accepted: take the request back, unless a replica accepted it
-- meanwhile. KEYS[1] the trigger requests (hash), ARGV[1] the instant.
-- Returns 1 when it was taken back, 0 when a replica had accepted it (or it was gone).
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return 0
end
local ok, record = pcall(cjson.decode, raw)
if ok and type(record) == 'table' and record.state ~= 'asked' then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
