-- --limit N above 1: take the lowest free of N slots and advance the fencing counter, atomically.
-- KEYS[1] the plain lock (held by a --limit 1 holder: a mismatch), KEYS[2] fencing counter,
-- KEYS[3] this attempt's "abandoned" marker, KEYS[4] the limit record (N, while holders exist),
-- KEYS[5] the slots' fencing tokens (hash), KEYS[6] the suspension (see acquire.lua),
-- KEYS[7...] the N slots
-- ARGV[1] holder value, ARGV[2] ttl in ms, ARGV[3] N
-- Returns {fencing token, 0, false, 0, 0, slot, 0} when a slot is taken; {0, ms until the first
-- slot frees, a holder value, 0, 0, -1, 0} when all N are held; {0, 0, false, 0, 0, -1, M} when the
-- current holders hold it with --limit M (M is not N: refused, nothing touched); each with an
-- eighth element, the attempt (1 when taken), and a ninth, the suspension record while KEY is
-- suspended (then nothing was taken), else false; and a tenth, eleventh and twelfth, 0
-- (acquire.lua's shape: no instant, no clock read).
if redis.replicate_commands then pcall(redis.replicate_commands) end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {0, 0, false, 0, 0, -1, 0, 0, false, 0, 0, 0}
end
local n = tonumber(ARGV[3])
local suspended = suspension_in_force(KEYS[6], true)
if suspended then
  return {0, 0, false, 0, 0, -1, 0, 0, suspended, 0, 0, 0}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, 0, false, 0, 0, -1, 1, 0, false, 0, 0, 0}
end
local recorded = tonumber(redis.call('GET', KEYS[4]) or '0')
if recorded and recorded ~= 0 and recorded ~= n then
  return {0, 0, false, 0, 0, -1, recorded, 0, false, 0, 0, 0}
end
local free, soonest, holder = nil, nil, false
for i = 7, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if not v then
    free = free or i
  else
    local left = redis.call('PTTL', KEYS[i])
    if not soonest or left < soonest then
      soonest, holder = left, v
    end
  end
end
if not free then
  return {0, soonest, holder, 0, 0, -1, 0, 0, false, 0, 0, 0}
end
local token, refused = fence_token(KEYS[2])
if not token then
  return refused
end
redis.call('SET', KEYS[free], ARGV[1], 'PX', ARGV[2])
local keep = math.max(redis.call('PTTL', KEYS[4]), tonumber(ARGV[2]))
redis.call('SET', KEYS[4], ARGV[3], 'PX', keep)
redis.call('SET', KEYS[2], token)
redis.call('HSET', KEYS[5], tostring(free - 7), token)
return {token, 0, false, 0, 0, free - 7, 0, 1, false, 0, 0, 0}
