-- Release the lock only while it is still ours, then record the run.
-- KEYS[1] lock, KEYS[2] last-run record, KEYS[3] run history list, KEYS[4] waiter notifications
-- ARGV[1] our holder value
-- ARGV[2] min-hold left in ms: > 0 keeps the lock that much longer instead of deleting it
-- ARGV[3] run record (JSON), '' for none
-- ARGV[4] history length (0: keep only the last run)
-- ARGV[5] record expiry in ms (0: none)
-- ARGV[6] notification expiry in ms
-- KEYS[5] the ledger of instants; ARGV[7] with --schedule, this run's instant ('' for none),
-- ARGV[8] its exit status: the attempt is marked succeeded (0) or failed, when it is still ours
-- and running, or was judged abandoned only for its lapse (an entry that ended is never
-- rewritten);
-- ARGV[9] '1' when cronlock was asked to end (SIGTERM, SIGINT: a drain, a shutdown) and the
-- command did not succeed: the attempt is 'interrupted', which --retries runs again;
-- ARGV[10] our holder value as a JSON string: an entry in the shape acquire.lua writes for a
-- first attempt (ending in that attempt, the holder and the state) is ended as text, any other
-- through cjson
-- KEYS[6] the runs replaced and still stopping (--overlap replace, see acquire.lua): a run whose
-- lock is no longer ours takes its name out of it, and its entry, 'replaced', gets its end.
-- With --limit above 1 (KEYS[1] is then our slot): KEYS[7] the limit record, KEYS[8...] every
-- slot; the record goes with the last slot, and lives at least as long as a slot kept for min-hold.
-- Returns 1 deleted, 2 kept for min-hold, 0 not ours (touched nothing of the lock).
-- The lock is dealt with first: if a record key has a wrong type, the release has still happened.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local result = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local hold = tonumber(ARGV[2])
  if hold > 0 then
    redis.call('PEXPIRE', KEYS[1], hold)
    if KEYS[7] and redis.call('PTTL', KEYS[7]) < hold then
      redis.call('PEXPIRE', KEYS[7], hold)
    end
    result = 2
  else
    redis.call('DEL', KEYS[1])
    if KEYS[7] then
      local any = false
      for i = 8, #KEYS do
        if redis.call('EXISTS', KEYS[i]) == 1 then any = true end
      end
      if not any then redis.call('DEL', KEYS[7]) end
    end
    -- Wake one waiter (BLPOP); the list never holds more than one element.
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], '1')
    redis.call('PEXPIRE', KEYS[4], ARGV[6])
    result = 1
  end
else
  redis.call('HDEL', KEYS[6], ARGV[1])
end
-- The run's record, once: a release asked again (the replica's answer was lost, the run then
-- released by itself; or a replica frozen past its run's own release woke and carried it out)
-- finds its record already there, the last one or (not ours: later runs may have followed) in
-- the history, and writes nothing.
local recorded = ARGV[3] == '' or redis.call('GET', KEYS[2]) == ARGV[3]
if not recorded and result == 0 and tonumber(ARGV[4]) > 0 then
  recorded = redis.call('LPOS', KEYS[3], ARGV[3]) ~= false
end
if not recorded then
  local ttl = tonumber(ARGV[5])
  if ttl > 0 then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl)
  else
    redis.call('SET', KEYS[2], ARGV[3])
  end
  local n = tonumber(ARGV[4])
  if n > 0 then
    redis.call('LPUSH', KEYS[3], ARGV[3])
    redis.call('LTRIM', KEYS[3], 0, n - 1)
    if ttl > 0 then
      redis.call('PEXPIRE', KEYS[3], ttl)
    else
      redis.call('PERSIST', KEYS[3])
    end
  else
    -- --history 0 keeps no list: trim away what earlier runs kept.
    redis.call('DEL', KEYS[3])
  end
end
if ARGV[7] ~= '' then
  -- The ledger: our attempt at the instant ended (even when the lock was lost: a failure).
  local raw = redis.call('HGET', KEYS[5], ARGV[7]) or ''
  local code = tonumber(ARGV[8])
  local state = (code == 0) and 'succeeded' or (ARGV[9] == '1' and 'interrupted' or 'failed')
  local tail = '"state":"running"}],"holder":' .. ARGV[10] .. ',"state":"running"}'
  if #raw > #tail and string.sub(raw, -#tail) == tail then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('HSET', KEYS[5], ARGV[7], string.sub(raw, 1, #raw - #tail) .. '"ended":'
      .. string.format('%d', now) .. ',"exit":' .. string.format('%d', code) .. ',"state":"'
      .. state .. '"}],"holder":' .. ARGV[10] .. ',"state":"' .. state .. '"}')
    return result
  end
  local ok, e = pcall(cjson.decode, raw)
  local last = ok and type(e) == 'table' and e.holder == ARGV[1] and type(e.attempts) == 'table'
    and e.attempts[#e.attempts]
  -- Only an entry still running under our attempt: an ended one is never written again. (One
  -- replaced, 'replaced', gets its end and keeps its state.) But an attempt judged abandoned
  -- only because its lock lapsed ('lapsed', acquire.lua) gets its real end when it comes, as
  -- long as no later attempt started: its run ended while Redis could not take the end.
  if type(last) == 'table' and (((e.state == 'running' or e.state == 'replaced') and not last.ended)
    or (e.state == 'abandoned' and last.lapsed)) then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if e.state ~= 'replaced' then e.state = state end
    last.state, last.ended, last.exit, last.lapsed = e.state, now, code, nil
    redis.call('HSET', KEYS[5], ARGV[7], cjson.encode(e))
  end
end
return result
