-- The replicas (--crontab) that serve from this Redis, for ranking who claims what: a hash of
-- replica ids, each valued by when it lapses (Redis's clock, ms) followed by ' full' when it is
-- at --max-jobs, then by ' offset=N' when the replica measured its clock (N ms: how far Redis's
-- clock is ahead of the replica's; readers of an earlier version read only the first two). One call is one replica's heartbeat: it renews (or, leaving, removes) the
-- caller, drops the lapsed, and returns who is live and who is full. Four calls in all (TIME,
-- HSET or HDEL, PEXPIRE, HGETALL), and an HDEL when some replica lapsed.
-- KEYS[1] the members hash, KEYS[2] the fleet's pokes (poke.lua: manual instants waiting,
-- --trigger)
-- ARGV[1] id, ARGV[2] lapse after (ms; 0: leave), ARGV[3] full (1) or not (0), ARGV[4] the most
-- ids to return, ARGV[5] the replica's clock offset (ms; '' when not measured)
-- Returns {live ids, full ids, pokes ('KEY\nINSTANT', at most ARGV[4]), Redis's clock (ms)}. The
-- pokes cost nothing while there are none (ZCARD of a missing key).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local most = tonumber(ARGV[4])
if not ttl or ttl < 0 or ttl > 3600000 or not most then
  return redis.error_reply('ERR bad lapse')
end
if ttl == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  local value = string.format('%d', now + ttl)
  if ARGV[3] == '1' then value = value .. ' full' end
  if tonumber(ARGV[5]) then value = value .. ' offset=' .. string.format('%d', tonumber(ARGV[5])) end
  redis.call('HSET', KEYS[1], ARGV[1], value)
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
end
local all = redis.call('HGETALL', KEYS[1])
local live, full, gone = {}, {}, {}
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local at = tonumber(string.match(v, '^%d+'))
  if not at or at <= now then
    gone[#gone + 1] = id
  elseif #live < most then
    live[#live + 1] = id
    if string.find(v, ' full', 1, true) then full[#full + 1] = id end
  end
end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
local pokes = {}
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  pokes = redis.call('ZRANGE', KEYS[2], 0, most - 1)
end
return {live, full, pokes, now}
