-- Keep a hash's `keep` newest fields (instants, Unix ms), trimmed in batches: once it holds more
-- than keep + slack, the oldest are deleted (never `spare`), so a hash written often pays for a
-- sort once every `slack` writes. Prepended to the scripts that keep a bounded hash (the ledger,
-- acquire.lua; the trigger requests, trigger.lua).
local function keep_newest(key, keep, slack, spare)
  if redis.call('HLEN', key) <= keep + slack then return end
  local fields = redis.call('HKEYS', key)
  local at = {}
  for i, f in ipairs(fields) do at[i] = tonumber(f) or 0 end
  table.sort(at)
  local gone = {}
  for i = 1, #at - keep do
    local f = string.format('%d', at[i])
    if f ~= spare then gone[#gone + 1] = f end
  end
  if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
end
