-- Tell one fleet of replicas (--crontab) that a manual instant of KEY waits (--trigger): every
-- replica of it reads the pokes with its heartbeat (members.lua) and claims the instant if it
-- serves KEY. KEYS[1] the fleet's pokes (sorted set: 'KEY\nINSTANT' scored by when it lapses,
-- Redis's clock), KEYS[2] the fleet's members hash, ARGV[1] the member, ARGV[2] how long it
-- lasts (ms; 0: take it back). Returns how many replicas the fleet has (live or lapsing).
if redis.replicate_commands then pcall(redis.replicate_commands) end
local span = tonumber(ARGV[2])
if not span or span < 0 or span > 3600000 then
  return redis.error_reply('ERR bad span')
end
if span == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return redis.call('HLEN', KEYS[2])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + span, ARGV[1])
-- (The set lives as long as its longest poke.)
if redis.call('PTTL', KEYS[1]) < span then
  redis.call('PEXPIRE', KEYS[1], span)
end
return redis.call('HLEN', KEYS[2])
