-- Which of a replica's waiting instants are already decided, so that it claims only the others
-- (an instant another replica should have claimed by now: `src/replica/table.rs`). Reads only.
-- KEYS: for each instant, its KEY's schedule record then its ledger; ARGV: the instants (Unix ms).
-- Returns, for each instant, 1 when its run started (the schedule record names it or a later
-- one) or the ledger records it skipped or missed, else 0.
local out = {}
for i = 1, #ARGV do
  local at = tonumber(ARGV[i])
  local ran = tonumber(redis.call('HGET', KEYS[2 * i - 1], 'instant'))
  local done = 0
  if at and ran and ran >= at then
    done = 1
  elseif at then
    local raw = redis.call('HGET', KEYS[2 * i], ARGV[i])
    if raw and (string.find(raw, '"state":"skipped"', 1, true)
      or string.find(raw, '"state":"missed"', 1, true)) then
      done = 1
    end
  end
  out[i] = done
end
return out
