-- --overlap replace: how many runs replaced (see acquire.lua) may still be stopping.
-- KEYS[1] the runs replaced (hash: holder value -> the Redis time in ms by which its lock would
-- have lapsed); a run's release takes its name out when it stopped. Those past their time are
-- dropped here.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local replaced = redis.call('HGETALL', KEYS[1])
local left = 0
for i = 1, #replaced, 2 do
  if (tonumber(replaced[i + 1]) or 0) <= now then
    redis.call('HDEL', KEYS[1], replaced[i])
  else
    left = left + 1
  end
end
return left
