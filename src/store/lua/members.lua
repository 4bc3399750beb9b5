-- The replicas (--crontab) that serve from this Redis, for ranking who claims what: a sorted set
-- of replica ids scored by when each lapses (Redis's clock), and beside it the ids of those at
-- --max-jobs. One call is one replica's heartbeat: it renews (or, leaving, removes) the caller,
-- drops the lapsed, and returns who is live and who is full.
-- KEYS[1] the live set, KEYS[2] the full set (same hash tag)
-- ARGV[1] id, ARGV[2] lapse after (ms; 0: leave), ARGV[3] full (1) or not (0)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 0 or ttl > 3600000 then
  return redis.error_reply('ERR bad lapse')
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if ttl == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if ARGV[3] == '1' then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
  else
    redis.call('ZREM', KEYS[2], ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
  redis.call('PEXPIRE', KEYS[2], ttl * 2)
end
return {redis.call('ZRANGE', KEYS[1], 0, 255), redis.call('ZRANGE', KEYS[2], 0, 255)}
