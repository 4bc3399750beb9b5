-- Take the lock and advance its fencing counter, atomically.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] this attempt's "abandoned" marker,
-- KEYS[4] the schedule record (hash: instant, schedule), KEYS[5] the --limit record (present while
-- holders with a --limit above 1 hold the KEY: then this --limit 1 attempt is a mismatch),
-- KEYS[6] the ledger of instants (hash: instant -> JSON entry), KEYS[7] the suspension (hash:
-- 'current', the record while --suspend is in force; 'pauses', the past ones as [[since, until]]),
-- KEYS[8] the manual instants asked for (--trigger: hash, instant -> request), KEYS[9] the runs
-- that were replaced and may still be stopping (--overlap replace: hash, holder value -> the Redis
-- time in ms by which its lock would have lapsed), KEYS[10] the instants running under --overlap
-- allow (hash, instant -> holder value)
-- ARGV[1] holder value, ARGV[2] ttl in ms, ARGV[3] the --schedule ('' without one),
-- ARGV[4] --catch-up window in ms (0: none), ARGV[5] --retries, ARGV[6] ledger expiry in ms
-- (0: none), ARGV[7] how many candidates follow, ARGV[8] the holder value as a JSON string,
-- ARGV[9] the attempt's host and run id as JSON members ('"host":"...","run_id":"..."'; both for
-- the ledger entry written without cjson), ARGV[10] the kind of instant: '0' the schedule's, '1'
-- a manual instant (--trigger: the one candidate, run once as a --catch-up instant is, whatever
-- the schedule's record says, and only while its request is there; the request is marked
-- accepted or skipped), '2' the instant that waits under --overlap queue (none: nothing due),
-- ARGV[11] --overlap: 'skip' (an instant that finds the lock held is recorded skipped) or 'queue'
-- (the first such instant waits, recorded 'queued' and named by the schedule record's 'queued',
-- and runs as soon as the lock is free, before any later instant; a further one is skipped),
-- 'replace' (an earlier instant's run that holds the lock is replaced: its lock goes to this
-- attempt, its entry reads 'replaced', and it is named in KEYS[9] until it ends; this attempt's
-- command waits for it, see the tenth element below) or 'allow' (each instant holds a lock of its
-- own, KEYS[1] .. ':at:' .. instant, in KEYS[1]'s hash slot, so instants run side by side, at
-- most ARGV[12] at once: an instant beyond that is busy, as under 'skip'),
-- ARGV[12] under 'allow', how many instants may run at once, ARGV[13...] with a schedule: its
-- instants around the client's clock, in Unix ms, then earlier instants inside the window (for
-- 'missed')
-- Returns {fencing token (a decimal string), 0, false, instant, 0} when taken, {0, ms until the holder's lock expires,
-- holder value, instant, 0} when held (waiters use it to sleep no longer than the holder's expiry;
-- -v names the holder), and {0, 0, false, instant, recorded instant} when the run for that
-- instant already started (or, with --catch-up, nothing is due: the instant is done, or out of
-- the window; an instant whose attempt runs now is held, as above). The instant is the candidate nearest to Redis's clock (0: no schedule); with
-- --catch-up, the latest one at or before Redis's clock (or one at most EARLY, and at most a tenth
-- of the period, ahead of it).
-- Every reply has three more elements, as semaphore.lua's: the slot (0 when taken, else -1), the
-- current holders' --limit when it is not 1 (then nothing was touched), else 0, and the attempt
-- at the instant (1, 2, ...; 0 when nothing was taken); and a ninth: the suspension record when
-- KEY is suspended (then nothing was taken, and the instant is recorded 'skipped'), else false;
-- and a tenth: under 'replace', when taken, how long (ms) a run it replaced (now or before) may
-- still be stopping: its command must not start before that, unless KEYS[9] is empty first;
-- and an eleventh: Redis's clock (ms) when the script read it (0: it did not), and a twelfth:
-- when an instant of the schedule is more than AHEAD ms ahead of that clock, how far (then nothing
-- was taken or written: the caller asks again when it is due), else 0. With --catch-up, an
-- instant abandoned for its lapse reads held (its holder's value, and the ms left of REPORT)
-- until its holder had REPORT ms to write its end, when --retries would run it again.
-- An instant that passed while KEY was suspended is recorded 'skipped' and never run, also
-- after --resume.
-- The GETs come first so a key of the wrong type fails before anything is written
-- (a script that errors half-way is not rolled back).
--
-- The token is max(stored + 1, Redis's TIME in microseconds), exactly (fence.lua, prepended):
-- strictly increasing for the KEY even when Redis lost the counter (restart without persistence,
-- FLUSHALL, eviction, a failover to a replica that missed the last write), as long as Redis's
-- clock does not go back.
-- Redis < 5 needs effects replication to write after TIME; Redis 7 always does it.
if redis.replicate_commands then pcall(redis.replicate_commands) end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- The client gave up on this attempt (its reply was lost) and asked for it to be undone.
  return {0, 0, false, 0, 0, -1, 0, 0, false, 0, 0, 0}
end
local limit = tonumber(redis.call('GET', KEYS[5]) or '0')
if limit and limit > 1 then
  return {0, 0, false, 0, 0, -1, limit, 0, false, 0, 0, 0}
end
-- An early host still runs the instant it fired for, when it is at most this far ahead.
local EARLY = 5000
-- An instant of the schedule is taken at most this far (ms) ahead of Redis's clock: a claim
-- that comes earlier takes nothing and is told how far ahead it is (the caller asks again
-- then), so a host whose clock runs fast neither starts a run early nor marks later instants
-- as run before their time (the schedule record's 'instant' only ever grows).
local AHEAD = 250
-- An attempt judged abandoned because its lock lapsed while its entry read running ('lapsed')
-- is tried again (--retries) only this long (ms, Redis's clock) after that judgment: its holder
-- may have ended while Redis was slow or away, and writes its end as soon as Redis answers
-- (release.lua takes it).
local REPORT = 2000
-- The ledger keeps this many instants, the newest.
local KEEP = 64
-- The suspension, read before anything is written (as every read here).
-- (A suspension whose --for has run out ends here: suspension.lua, prepended.)
local suspension = redis.call('HMGET', KEYS[7], 'current', 'pauses')
local suspended, ended = suspension_in_force(KEYS[7], true, suspension[1])
local paused = suspension[2]
if ended then paused = redis.call('HGET', KEYS[7], 'pauses') end
local pauses = {}
if paused then
  local ok, p = pcall(cjson.decode, paused)
  if not ok or type(p) ~= 'table' then
    return redis.error_reply('ERR the pauses of ' .. KEYS[7] .. ' are not ones cronlock wrote (left as they are)')
  end
  pauses = p
end
-- Whether the instant `at` passed while KEY was suspended.
local function in_pause(at)
  for _, p in ipairs(pauses) do
    if type(p) == 'table' and tonumber(p[1]) and tonumber(p[2])
      and at >= tonumber(p[1]) and at <= tonumber(p[2]) then
      return true
    end
  end
  return false
end
-- Keep the ledger's KEEP newest instants (newest.lua, prepended: trimmed in batches of SLACK),
-- expiring as --history-ttl says; readers show the KEEP newest.
local SLACK = 16
local function keep_ledger()
  keep_newest(KEYS[6], KEEP, SLACK, nil)
  local ttl = tonumber(ARGV[6])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[6], ttl) else redis.call('PERSIST', KEYS[6]) end
end
local instant, attempt, entry, now, t, ran = 0, 0, nil, 0, nil, nil
-- Every reply ends with two more elements: Redis's clock (ms; 0 when this script did not read it)
-- and, when the instant was not taken because Redis's clock has not reached it (by more than
-- AHEAD), how far ahead of it the instant is (ms; else 0).
local function reply(r, ahead)
  r[11], r[12] = now, ahead or 0
  return r
end
-- The last instants started, the schedule's and a manual one (the schedule record's 'instant'
-- and 'manual').
local scheduled_ran, manual_ran = nil, nil
local window = tonumber(ARGV[4]) or 0
local n = tonumber(ARGV[7]) or 0
local manual = ARGV[10] == '1'
local take_queued = ARGV[10] == '2'
local queue = ARGV[11] == 'queue'
local replace = ARGV[11] == 'replace'
local allow = ARGV[11] == 'allow'
-- The lock this attempt takes: KEY's, or under 'allow' its instant's own (set once the instant
-- is known: lock_at, in KEYS[1]'s hash slot; Keys::at names it the same).
local lock = KEYS[1]
local function lock_at(field) return KEYS[1] .. ':at:' .. field end
-- When the run of the instant `at` whose lock `by` holds started (Redis's clock), by its ledger
-- entry (nil when the entry does not name it).
local function started_at(at, by)
  local ok, e = pcall(cjson.decode, redis.call('HGET', KEYS[6], string.format('%d', at)) or '')
  if ok and type(e) == 'table' and e.holder == by and type(e.attempts) == 'table'
    and type(e.attempts[#e.attempts]) == 'table' then
    return tonumber(e.attempts[#e.attempts].started)
  end
  return nil
end
-- Whether one of the runs that make KEY busy (`held`: instant -> holder value) started after
-- the manual instant was asked for: then the manual instant waits for it instead of being
-- skipped (a replica learns of a trigger in the slot where it claims the next second's
-- instants, so a job that runs often would skip every "run now"). (A rare path: cjson.)
local function busy_since_asked(held)
  local ok, r = pcall(cjson.decode, redis.call('HGET', KEYS[8], string.format('%d', instant)) or '')
  local asked = ok and type(r) == 'table' and tonumber(r.asked)
  if not asked then return false end
  for at, by in pairs(held) do
    local since = started_at(at, by)
    if since and since >= asked then return true end
  end
  return false
end
-- Mark the manual instant's request `state` (a rare path: cjson).
local function answer_request(state, by)
  if not manual then return end
  local field = string.format('%d', instant)
  local raw = redis.call('HGET', KEYS[8], field)
  local ok, r = pcall(cjson.decode, raw or '')
  if ok and type(r) == 'table' then
    r.state = state
    if by then r.by = by end
    r.retries = tonumber(ARGV[5])
    redis.call('HSET', KEYS[8], field, cjson.encode(r))
  end
end
if ARGV[3] ~= '' then
  t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if manual then
    instant = tonumber(ARGV[13]) or 0
    local request = instant ~= 0 and redis.call('HGET', KEYS[8], string.format('%d', instant))
    if not request then
      -- No such request (taken back, or never asked): nothing to run.
      return reply({0, 0, false, instant, instant, -1, 0, 0, false, 0})
    end
    -- Taken already (accepted or skipped): its ledger entry judges a retry; without one (the
    -- ledger keeps its newest instants only) it ran, and never runs again while the request is
    -- there. (The request's own words are JSON strings, where '"' is escaped.)
    if not string.find(request, '"state":"asked"', 1, true)
      and not string.find(request, '"state":"queued"', 1, true)
      and redis.call('HEXISTS', KEYS[6], string.format('%d', instant)) == 0 then
      return reply({0, 0, false, instant, instant, -1, 0, 0, false, 0})
    end
  elseif take_queued then
    instant = tonumber(redis.call('HGET', KEYS[4], 'queued')) or 0
    if instant == 0 then
      -- Nothing waits: nothing due.
      return reply({0, 0, false, 0, 1, -1, 0, 0, false, 0})
    end
  elseif window == 0 then
    -- The run belongs to the scheduled instant nearest to Redis's clock, whatever the hosts'.
    for i = 13, 12 + n do
      local c = tonumber(ARGV[i])
      if instant == 0 or math.abs(c - now) < math.abs(instant - now) then
        instant = c
      end
    end
  else
    -- The latest instant at or before Redis's clock, unless the host fired a little early.
    local past, ahead = 0, 0
    for i = 13, 12 + n do
      local c = tonumber(ARGV[i])
      if c <= now then
        if c > past then past = c end
      elseif ahead == 0 or c < ahead then
        ahead = c
      end
    end
    instant = past
    -- "A little" is at most a tenth of the period, so a firing between instants (a replica's
    -- start or second look) runs the past instant, not the next one early.
    local early = EARLY
    if past ~= 0 and ahead ~= 0 then early = math.min(EARLY, math.floor((ahead - past) / 10)) end
    if ahead ~= 0 and ahead - now <= early and (past == 0 or ahead - now < now - past) then
      instant = ahead
    end
  end
  if allow and instant ~= 0 then lock = lock_at(string.format('%d', instant)) end
  local record = redis.call('HMGET', KEYS[4], 'instant', 'manual')
  ran, manual_ran = tonumber(record[1]), tonumber(record[2])
  scheduled_ran = ran
  -- Not yet due by Redis's clock (unless it ran already): nothing is taken or written.
  if not manual and not take_queued and instant - now > AHEAD
    and not (window == 0 and ran and ran >= instant) then
    return reply({0, 0, false, instant, 0, -1, 0, 0, false, 0}, instant - now)
  end
  if manual then ran = nil end
  local raw = redis.call('HGET', KEYS[6], string.format('%d', instant))
  if raw then
    local ok, e = pcall(cjson.decode, raw)
    if not ok or type(e) ~= 'table' or type(e.state) ~= 'string' or type(e.attempts) ~= 'table' then
      return redis.error_reply('ERR the ledger entry ' .. string.format('%d', instant) .. ' of '
        .. KEYS[6] .. ' is not one cronlock wrote (left as it is)')
    end
    entry = e
  end
  -- Suspended now, or the instant passed while it was: recorded skipped, never run.
  -- (An instant skipped for an overlap may still start late, if the lock frees in time; not
  -- under --overlap queue, where the one that waits is 'queued'.)
  local skip = suspended or in_pause(instant)
    or (entry and entry.state == 'skipped' and (entry.reason ~= 'overlap' or queue))
  if skip and instant ~= 0 and not entry then
    if manual then
      redis.call('HSET', KEYS[6], string.format('%d', instant),
        '{"state":"skipped","reason":"suspended","manual":true,"attempts":{}}')
    else
      redis.call('HSET', KEYS[6], string.format('%d', instant), '{"state":"skipped","attempts":{}}')
    end
    keep_ledger()
  end
  if skip then answer_request('skipped') end
  if suspended then
    return reply({0, 0, false, instant, 0, -1, 0, 0, suspended, 0})
  end
  if skip then
    return reply({0, 0, false, instant, instant, -1, 0, 0, false, 0})
  end
  if window == 0 and not manual then
    if ran and ran >= instant then
      -- With the lock's holder: on several masters, a grant held on a minority (and undone a
      -- moment later) must not read as "already ran" to a contender (store/round.rs).
      return reply({0, 0, redis.call('GET', lock), instant, ran, -1, 0, 0, false, 0})
    end
    attempt = 1
  else
    -- Nothing due: out of the window, a later run started, or this instant is done. (A manual
    -- instant is due while its request is there.)
    if not manual and (instant == 0 or now - instant > window) then
      return reply({0, 0, false, instant, instant, -1, 0, 0, false, 0})
    end
    if ran and ran > instant then
      return reply({0, 0, false, instant, ran, -1, 0, 0, false, 0})
    end
    attempt = 1
    if entry then
      local last = entry.attempts[#entry.attempts]
      if entry.state == 'running' and redis.call('GET', lock) ~= entry.holder
        and type(last) == 'table' then
        -- Claimed, never released, and its lock is gone: its host died mid-run, or its run
        -- ended while Redis could not take its end (slow, or away).
        entry.state = 'abandoned'
        last.ended, last.state, last.lapsed = now, 'abandoned', true
        redis.call('HSET', KEYS[6], string.format('%d', instant), cjson.encode(entry))
      end
      if entry.state == 'running' then
        -- Its attempt runs now, under its lock: held elsewhere. A --wait waits for its end, and
        -- a replica (--crontab) looks again when that lock would lapse if its host died.
        return reply({0, redis.call('PTTL', lock), entry.holder, instant, 0, -1, 0, 0, false, 0})
      end
      -- Abandoned for its lapse: its holder has REPORT ms to say how it ended before --retries
      -- runs it again (held elsewhere until then).
      local judged = type(last) == 'table' and last.lapsed and tonumber(last.ended)
      if entry.state == 'abandoned' and judged and now - judged < REPORT
        and #entry.attempts <= tonumber(ARGV[5]) then
        return reply({0, REPORT - (now - judged), entry.holder or false, instant, 0, -1, 0, 0,
          false, 0})
      end
      if (entry.state ~= 'failed' and entry.state ~= 'abandoned' and entry.state ~= 'interrupted')
        or #entry.attempts > tonumber(ARGV[5]) then
        return reply({0, 0, false, instant, instant, -1, 0, 0, false, 0})
      end
      attempt = #entry.attempts + 1
    end
  end
end
if suspended then
  return reply({0, 0, false, 0, 0, -1, 0, 0, suspended, 0})
end
-- Busy without --catch-up: the instant is recorded skipped for an overlap (unless the ledger has
-- it: its own attempt holds the lock), so every instant is accounted for. With --catch-up it is
-- tried again later, and recorded then.
local function overlapped()
  if instant ~= 0 and manual and not entry then
    redis.call('HSET', KEYS[6], string.format('%d', instant),
      '{"state":"skipped","reason":"overlap","manual":true,"attempts":{}}')
    keep_ledger()
    answer_request('skipped')
  elseif instant ~= 0 and window == 0 and not entry then
    redis.call('HSET', KEYS[6], string.format('%d', instant),
      '{"state":"skipped","reason":"overlap","attempts":{}}')
    keep_ledger()
  end
end
local holder = redis.call('GET', lock)
-- --overlap allow: at most ARGV[12] instants at once (the running ones are counted by their
-- locks; an entry whose lock is gone is dropped, and its instant, if its ledger entry still reads
-- running under that holder, is ended abandoned: its run died without ending it, whichever
-- instant it was). Busy beyond that, as when the lock is held.
if allow and not holder and instant ~= 0 then
  local running = redis.call('HGETALL', KEYS[10])
  local live, soonest, by = 0, nil, false
  for i = 1, #running, 2 do
    local left = redis.call('PTTL', lock_at(running[i]))
    if left == -2 then
      redis.call('HDEL', KEYS[10], running[i])
      local ok, e = pcall(cjson.decode, redis.call('HGET', KEYS[6], running[i]) or '')
      if ok and type(e) == 'table' and e.state == 'running' and e.holder == running[i + 1]
        and type(e.attempts) == 'table' and type(e.attempts[#e.attempts]) == 'table' then
        local last = e.attempts[#e.attempts]
        last.state, last.ended, last.lapsed = 'abandoned', now, true
        e.state = 'abandoned'
        redis.call('HSET', KEYS[6], running[i], cjson.encode(e))
      end
    else
      live = live + 1
      if not soonest or left < soonest then soonest, by = left, running[i + 1] end
    end
  end
  if live >= (tonumber(ARGV[12]) or 1) then
    -- (A manual instant waits when a run that fills the limit started after it was asked.)
    if manual and not entry then
      local held = {}
      for i = 1, #running, 2 do
        if tonumber(running[i]) then held[tonumber(running[i])] = running[i + 1] end
      end
      if busy_since_asked(held) then
        answer_request('queued')
        return reply({0, soonest, by, instant, 0, -1, 0, 0, false, 0})
      end
    end
    overlapped()
    return reply({0, soonest, by, instant, 0, -1, 0, 0, false, 0})
  end
end
-- --overlap replace: an earlier instant's run (the last one started, the schedule's or a manual
-- one, whose entry names this holder) is replaced: its entry reads 'replaced' (release.lua ends
-- it when its run stops), it is named in KEYS[9] until its lock would have lapsed, and its lock
-- is taken below. Another holder (a run without --schedule, this instant's own attempt, a later
-- instant's run, a lock without an expiry to bound the wait) is not. A manual instant ("run
-- now") replaces the last started run whatever its instant.
if replace and holder and instant ~= 0 and not take_queued then
  for _, last_started in pairs({scheduled_ran, manual_ran}) do
    if holder and (last_started < instant or (manual and last_started ~= instant))
      and redis.call('PTTL', lock) > 0 then
      local field = string.format('%d', last_started)
      local ok, e = pcall(cjson.decode, redis.call('HGET', KEYS[6], field) or '')
      if ok and type(e) == 'table' and e.state == 'running' and e.holder == holder
        and type(e.attempts) == 'table' and #e.attempts > 0 then
        -- (A counter that cannot give a token refuses before the takeover writes anything.)
        local can, refused = fence_token(KEYS[2], t)
        if not can then return refused end
        local left = redis.call('PTTL', lock)
        redis.call('HSET', KEYS[9], holder, string.format('%d', now + left))
        if redis.call('PTTL', KEYS[9]) < left then redis.call('PEXPIRE', KEYS[9], left) end
        local last = e.attempts[#e.attempts]
        if type(last) == 'table' then last.state, last.replaced = 'replaced', now end
        e.state = 'replaced'
        redis.call('HSET', KEYS[6], field, cjson.encode(e))
        redis.call('DEL', lock)
        holder = false
      end
    end
  end
end
if holder then
  -- A manual instant waits (its request reads 'queued'; the replicas claim it again when the
  -- run before it ends), and is recorded once it runs or is given up: under --overlap queue, and
  -- under the others when the run that holds the lock started after it was asked for.
  local held = {}
  if manual and not queue and instant ~= 0 and not entry then
    for _, at in pairs({scheduled_ran, manual_ran}) do held[at] = holder end
  end
  if manual and instant ~= 0 and not entry and (queue or busy_since_asked(held)) then
    answer_request('queued')
    return reply({0, redis.call('PTTL', lock), holder, instant, 0, -1, 0, 0, false, 0})
  end
  -- --overlap queue: the first instant that finds the lock held waits (one at most).
  if queue and instant ~= 0 and window == 0 and not manual and not take_queued and not entry
    and not redis.call('HGET', KEYS[4], 'queued') then
    redis.call('HSET', KEYS[4], 'queued', string.format('%d', instant))
    redis.call('HSET', KEYS[6], string.format('%d', instant), '{"state":"queued","attempts":{}}')
    keep_ledger()
    return reply({0, redis.call('PTTL', lock), holder, instant, 0, -1, 0, 0, false, 0})
  end
  overlapped()
  return reply({0, redis.call('PTTL', lock), holder, instant, 0, -1, 0, 0, false, 0})
end
-- The token first: a counter that cannot give one refuses before anything is written.
local token, refused = fence_token(KEYS[2], t)
if not token then
  return refused
end
-- --overlap queue, the lock free: the instant that waits runs first (this one waits in its
-- place, unless the ledger has it already); a stale name (its entry no longer waits) is dropped.
if queue and not manual and instant ~= 0 and window == 0 then
  local q = tonumber(redis.call('HGET', KEYS[4], 'queued'))
  local qe = nil
  if q and q ~= instant then
    local ok, e = pcall(cjson.decode, redis.call('HGET', KEYS[6], string.format('%d', q)) or '')
    if ok and type(e) == 'table' and e.state == 'queued' and type(e.attempts) == 'table' then
      qe = e
    end
  end
  if qe then
    if not entry then
      redis.call('HSET', KEYS[4], 'queued', string.format('%d', instant))
      redis.call('HSET', KEYS[6], string.format('%d', instant), '{"state":"queued","attempts":{}}')
    else
      redis.call('HDEL', KEYS[4], 'queued')
    end
    instant, entry, attempt = q, qe, 1
  elseif q then
    redis.call('HDEL', KEYS[4], 'queued')
  end
end
if not redis.call('SET', lock, ARGV[1], 'NX', 'PX', ARGV[2]) then
  return reply({0, redis.call('PTTL', lock), redis.call('GET', lock), instant, 0, -1, 0, 0, false, 0})
end
if allow and instant ~= 0 then redis.call('HSET', KEYS[10], string.format('%d', instant), ARGV[1]) end
if instant ~= 0 then
  -- The last started instant's entry, still running although its lock was free (this acquire
  -- took it): its run died without ending it (its replica was killed). It is ended abandoned, so
  -- no instant reads running for good. (Rare: cjson only then.)
  -- (The last manual instant started is kept apart, 'manual', and looked at the same way.)
  local started = {scheduled_ran, manual_ran}
  for _, last_started in pairs(started) do
    if last_started ~= instant then
      local field = string.format('%d', last_started)
      local prev = redis.call('HGET', KEYS[6], field)
      -- (Under 'allow' an earlier instant holds a lock of its own: abandoned only once it is gone.
      -- An entry written through cjson, a queued or later attempt's, has its fields in any order:
      -- looked for anywhere, and decoded only then.)
      if prev and string.find(prev, '"state":"running"', 1, true)
        and (not allow or redis.call('EXISTS', lock_at(field)) == 0) then
        local ok, e = pcall(cjson.decode, prev)
        if ok and type(e) == 'table' and e.state == 'running' and type(e.attempts) == 'table'
          and #e.attempts > 0 then
          local last = e.attempts[#e.attempts]
          if type(last) == 'table' then
            last.state, last.ended, last.lapsed = 'abandoned', now, true
          end
          e.state = 'abandoned'
          redis.call('HSET', KEYS[6], field, cjson.encode(e))
        end
      end
    end
  end
  if manual then
    redis.call('HSET', KEYS[4], 'manual', string.format('%d', instant), 'schedule', ARGV[3])
  else
    redis.call('HSET', KEYS[4], 'instant', string.format('%d', instant), 'schedule', ARGV[3])
  end
  -- The ledger: this attempt, and the instants inside the window nobody ran. A first attempt's
  -- entry is written as text, in the shape release.lua ends without decoding it (cjson costs
  -- Redis more than the rest of a claim); a later attempt's goes through cjson.
  local text
  if entry then
    -- (The instant that waited under --overlap queue: an undo lets it wait again.)
    if entry.state == 'queued' then entry.queued = true end
    entry.state = 'running'
    entry.holder = ARGV[1]
    local h = cjson.decode(ARGV[1])
    entry.attempts[#entry.attempts + 1] = {host = h.host, run_id = h.token, fence = token,
      started = now, state = 'running'}
    text = cjson.encode(entry)
  else
    text = '{"attempts":[{' .. ARGV[9] .. ',"fence":"' .. token .. '","started":'
      .. string.format('%d', now) .. ',"state":"running"}],"holder":' .. ARGV[8]
      .. ',"state":"running"}'
    if manual then
      -- (release.lua ends a first attempt's entry as text only in the shape above.)
      entry = cjson.decode(text)
      entry.manual = true
      text = cjson.encode(entry)
    end
  end
  if manual then answer_request('accepted', cjson.decode(ARGV[1]).host) end
  redis.call('HSET', KEYS[6], string.format('%d', instant), text)
  if window > 0 and not manual then
    for i = 13, #ARGV do
      local c = tonumber(ARGV[i])
      local field = string.format('%d', c)
      if c < instant and now - c <= window and redis.call('HEXISTS', KEYS[6], field) == 0 then
        local state = in_pause(c) and 'skipped' or 'missed'
        redis.call('HSET', KEYS[6], field, '{"state":"' .. state .. '","attempts":{}}')
      end
    end
  end
  keep_ledger()
end
redis.call('SET', KEYS[2], token)
-- --overlap replace: how long the runs replaced may still be stopping (those gone by then are
-- forgotten).
local after = 0
if replace then
  local replaced = redis.call('HGETALL', KEYS[9])
  for i = 1, #replaced, 2 do
    local left = (tonumber(replaced[i + 1]) or 0) - now
    if left <= 0 then
      redis.call('HDEL', KEYS[9], replaced[i])
    elseif left > after then
      after = left
    end
  end
end
-- The token as a decimal string: a Lua number would round it above 2^53.
return reply({token, 0, false, instant, 0, 0, 0, attempt, false, after})
