-- A suspension's end (--suspend --for), prepended to every script that reads a suspension: a
-- record whose 'until' has passed on Redis's clock is not in force, and with `lapse` it is ended
-- here as --resume ends it (its time kept in 'pauses', so an instant that passed meanwhile still
-- never runs). So a paused KEY runs again at its first instant after 'until', with no one to
-- resume it and whichever host fires first.
if redis.replicate_commands then pcall(redis.replicate_commands) end

-- The record in force at `key` (a JSON string), or false, and whether one ended here. A record
-- cronlock did not write, or one with no 'until', is in force until --resume. `current`: the
-- record as the caller read it already (nil: read here).
local function suspension_in_force(key, lapse, current)
  if current == nil then
    current = redis.call('HGET', key, 'current')
  end
  if not current then
    return false, false
  end
  local ok, record = pcall(cjson.decode, current)
  if not ok or type(record) ~= 'table' or not tonumber(record['until']) then
    return current, false
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ends = tonumber(record['until'])
  if now < ends then
    return current, false
  end
  if lapse then
    local raw = redis.call('HGET', key, 'pauses')
    local pauses = {}
    if raw then
      local ok2, p = pcall(cjson.decode, raw)
      if not ok2 or type(p) ~= 'table' then
        -- Left as they are; the script reading them says so.
        return false, false
      end
      pauses = p
    end
    pauses[#pauses + 1] = {tonumber(record.since) or ends, ends}
    while #pauses > 16 do table.remove(pauses, 1) end
    redis.call('HSET', key, 'pauses', cjson.encode(pauses))
    redis.call('HDEL', key, 'current')
  end
  return false, lapse
end
