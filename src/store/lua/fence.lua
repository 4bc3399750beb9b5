-- Fencing tokens, exactly (prepended to every script that hands out or raises one). Lua numbers
-- are doubles, exact only below 2^53, so a token is kept, compared and incremented as a decimal
-- string, and is never above 2^63 - 1 (the largest integer of Redis and of cronlock). Every
-- check reads before anything is written: a script that fails half-way is not rolled back.
local FENCE_MAX = '9223372036854775807'

-- a < b, for decimal strings without leading zeros.
local function fence_less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- a + 1, for a decimal string.
local function fence_next(a)
  local i = #a
  while i > 0 and string.sub(a, i, i) == '9' do
    i = i - 1
  end
  local tail = string.rep('0', #a - i)
  if i == 0 then
    return '1' .. tail
  end
  return string.sub(a, 1, i - 1) .. tostring(tonumber(string.sub(a, i, i)) + 1) .. tail
end

-- The counter at `key` as a decimal string ('0' when there is none), or nil and an error reply
-- naming the key and the value when it is not a token cronlock could have written.
local function fence_read(key)
  local v = redis.call('GET', key)
  if not v then
    return '0'
  end
  local digits = string.match(v, '^%d+$') and (string.gsub(v, '^0+', ''))
  if digits == '' then
    digits = '0'
  end
  if not digits or fence_less(FENCE_MAX, digits) then
    return nil, redis.error_reply('ERR fencing counter ' .. key .. ' holds "'
      .. string.sub(v, 1, 40) .. '", not a token cronlock wrote (a count from 0 to '
      .. FENCE_MAX .. '): repair or delete it')
  end
  return digits
end

-- The next token for the counter at `key`: max(stored + 1, Redis's TIME in microseconds), so
-- tokens grow even when Redis lost the counter (a restart, a flush, a failover), as long as its
-- clock does not go back. `time`: a TIME reply the script already has (nil: ask). Nil and an
-- error reply when the counter cannot give a greater one.
local function fence_token(key, time)
  local stored, err = fence_read(key)
  if not stored then
    return nil, err
  end
  if stored == FENCE_MAX then
    return nil, redis.error_reply('ERR fencing counter ' .. key .. ' is at ' .. FENCE_MAX
      .. ', the largest token: no greater one can be handed out (delete it only when no '
      .. 'consumer of the tokens remembers them)')
  end
  local t = time or redis.call('TIME')
  local now = (string.gsub(t[1] .. string.format('%06d', tonumber(t[2])), '^0+', ''))
  local nxt = fence_next(stored)
  if fence_less(nxt, now) then
    return now
  end
  return nxt
end

