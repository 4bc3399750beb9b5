-- Where a manual instant (--trigger) stands: its request and its ledger entry.
-- KEYS[1] the trigger requests (hash), KEYS[2] the ledger of instants; ARGV[1] the instant
-- Returns {the request (JSON) or false, the ledger entry (JSON) or false}. Read-only.
return {redis.call('HGET', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1])}
