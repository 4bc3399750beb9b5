-- Undo an acquisition that did not become a run: its reply was lost (the client does not know
-- whether the acquire script ran, and may be about to run, on the server), a majority did not
-- grant it, or the replica that won it could not start its run.
-- KEYS[1] lock, KEYS[2] the attempt's "abandoned" marker, KEYS[3] the schedule record, KEYS[4] the
-- ledger, KEYS[5] the manual instants asked for (--trigger), KEYS[6...] other locks the attempt
-- may hold (the slots of a --limit above 1: a reply lost or a split vote does not say which one
-- a master granted); ARGV[1] holder value, ARGV[2] ttl in ms, ARGV[3] the attempt's run id (the holder's
-- token), ARGV[4] 'undo' (the claim is rolled back: the instant can be claimed again at once),
-- 'give-back' (the same, from a run whose replica no longer answers for the instant) or
-- 'abandoned' (the attempt is ended as abandoned: its run died after its lock lapsed).
-- If a lock holds our value, delete it. Leave the marker for a TTL, so an acquire script of this
-- attempt that runs later takes nothing. Then the ledger entry whose last attempt is ours and
-- still running: its instant's own lock (--overlap allow, KEYS[1] .. ':at:' .. instant, and its
-- place among the instants running) deleted if it holds our value; undone, the attempt is
-- removed (the entry with it when it was the first) and the schedule record no longer names the
-- instant, and what the claim consumed is given back: the instant that waited under --overlap
-- queue waits again, first in line (a later instant that took its place is skipped, as a second
-- one that waits is), and a manual instant's request is asked again; abandoned, the attempt and
-- the entry are ended.
-- An entry that ended, or whose last attempt is another's, is never touched. An undo that comes
-- more than LATE_UNDO ms after its instant of the schedule (Redis's clock) ends the attempt
-- 'interrupted' instead of rolling it back, when it is a give-back: the other replicas judged the
-- instant decided by then.
-- Returns 1 when it deleted our lock, 0 otherwise.
-- (The other replicas check an instant 250 ms after it: replica/fleets.rs's FALLBACK_MS.)
local LATE_UNDO = 200
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local result = 0
local slots_held = false
for i = 1, #KEYS do
  if i == 1 or i > 5 then
    local v = redis.call('GET', KEYS[i])
    if v == ARGV[1] then
      redis.call('DEL', KEYS[i])
      result = 1
    elseif v and i > 5 then
      slots_held = true
    end
  end
end
-- (The --limit record lives while holders exist: gone with the last slot.)
if #KEYS > 5 and result == 1 and not slots_held then
  redis.call('DEL', KEYS[1] .. ':limit')
end
if not KEYS[4] or not ARGV[3] or ARGV[3] == '' then
  return result
end
local needle = '"run_id":"' .. ARGV[3] .. '"'
local all = redis.call('HGETALL', KEYS[4])
for i = 1, #all, 2 do
  local field, raw = all[i], all[i + 1]
  if string.find(raw, needle, 1, true) then
    local ok, e = pcall(cjson.decode, raw)
    if ok and type(e) == 'table' and e.state == 'running' and type(e.attempts) == 'table'
      and #e.attempts > 0 and type(e.attempts[#e.attempts]) == 'table'
      and e.attempts[#e.attempts].run_id == ARGV[3] then
      local last = e.attempts[#e.attempts]
      local own = KEYS[1] .. ':at:' .. field
      if redis.call('GET', own) == ARGV[1] then
        redis.call('DEL', own)
        redis.call('HDEL', KEYS[1] .. ':running', field)
        result = 1
      end
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      -- An undo of an instant of the schedule that comes late (its run waited, for the run it
      -- replaced say, and its replica died or drained meanwhile): the other replicas checked
      -- it and found it decided, so nobody would claim it again. Its attempt ends interrupted
      -- instead (recorded, and run again under --retries).
      local late = ARGV[4] == 'give-back' and #e.attempts == 1 and not e.queued and not e.manual
        and tonumber(field) and now - tonumber(field) > LATE_UNDO
      if ARGV[4] == 'abandoned' or late then
        local state = late and 'interrupted' or 'abandoned'
        last.state, last.ended = state, now
        e.state = state
        redis.call('HSET', KEYS[4], field, cjson.encode(e))
      else
        if #e.attempts == 1 and e.queued then
          local q = redis.call('HGET', KEYS[3], 'queued')
          if q and q ~= field then
            local fine, qe = pcall(cjson.decode, redis.call('HGET', KEYS[4], q) or '')
            if fine and type(qe) == 'table' and qe.state == 'queued' then
              redis.call('HSET', KEYS[4], q, '{"state":"skipped","reason":"overlap","attempts":{}}')
            end
          end
          redis.call('HSET', KEYS[3], 'queued', field)
          redis.call('HSET', KEYS[4], field, '{"state":"queued","attempts":{}}')
        elseif #e.attempts == 1 then
          redis.call('HDEL', KEYS[4], field)
          if e.manual then
            local fine, r = pcall(cjson.decode, redis.call('HGET', KEYS[5], field) or '')
            if fine and type(r) == 'table' then
              r.state, r.by = 'asked', nil
              redis.call('HSET', KEYS[5], field, cjson.encode(r))
            end
          end
        else
          table.remove(e.attempts)
          e.state = e.attempts[#e.attempts].state or 'failed'
          redis.call('HSET', KEYS[4], field, cjson.encode(e))
        end
        local at = tonumber(field)
        if at and tonumber(redis.call('HGET', KEYS[3], 'instant')) == at then
          redis.call('HSET', KEYS[3], 'instant', string.format('%d', at - 1))
        end
      end
    end
  end
end
return result
