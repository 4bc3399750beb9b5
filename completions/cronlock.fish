complete -c cronlock -s u -l redis-url -d 'Redis URL: redis://[user][:password@]host[:port][/db], rediss://... (TLS), redis+unix:///path, redis+sentinel://[user][:password@]host[:port][,host...]/SERVICE[/db] or redis+cluster://[user][:password@]host:port[,host:port...]; repeat it (or separate URLs with spaces in the variable) for a quorum of independent masters' -r
complete -c cronlock -l redis-url-file -d 'Read the Redis URL(s) from this file instead (surrounding whitespace trimmed; several URLs separated by whitespace), so no password shows in any command line or environment: a Docker or Kubernetes secret mounted as a file, owned by this user or root and writable by nobody else (as a crontab). A flag wins over a variable (-u over CRONLOCK_REDIS_URL_FILE, --redis-url-file over CRONLOCK_REDIS_URL); both flags, or both variables, are refused' -r -F
complete -c cronlock -l tls-ca-cert -d 'For rediss://: trust the CA certificates in this PEM file instead of the system\'s store' -r -F
complete -c cronlock -l tls-cert -d 'For rediss://: client certificate (PEM) for servers that require mutual TLS; needs --tls-key' -r -F
complete -c cronlock -l tls-key -d 'For rediss://: the private key (PEM) of --tls-cert' -r -F
complete -c cronlock -s t -l ttl -d 'Lock expiry in Redis; it only matters when the holder dies' -r
complete -c cronlock -s w -l wait -d 'How long to wait for a busy lock before giving up (0: do not wait)' -r
complete -c cronlock -l grace -d 'Time between SIGTERM and SIGKILL when cronlock stops the command [default: 5s, at most a quarter of --ttl]' -r
complete -c cronlock -l max-runtime -d 'Stop the command (SIGTERM, then SIGKILL after --grace) when it runs longer; exit 124 (0: no limit)' -r
complete -c cronlock -l min-hold -d 'Keep the lock until at least this long after it was taken, even when the command finishes sooner' -r
complete -c cronlock -l limit -d 'Let up to N hosts hold KEY at once (a semaphore), each with a slot of its own: the command gets CRONLOCK_SLOT (0..N-1). Every host must give the same N. With --schedule, only under --overlap allow: at most N instants run at once' -r
complete -c cronlock -l schedule -d 'Run once per instant of this cron schedule across the fleet: a host firing for an instant that already ran skips (exit -E), even after the lock was released' -r
complete -c cronlock -l jitter -d 'With --schedule: start each instant\'s run an offset after it, drawn from KEY within DURATION (the same on every host and after every restart), so jobs due at the same instant do not all start at once; shorter than the schedule\'s period. The instant keeps its name (CRONLOCK_INSTANT, the ledger)' -r
complete -c cronlock -l overlap -d 'With --schedule: what an instant does that finds the lock still held by an earlier instant\'s run: skip (recorded skipped), queue (the first waits and starts as soon as that run ends; a further one is skipped), replace (the earlier run is stopped, SIGTERM then SIGKILL after --grace, and recorded replaced; this one starts once it is gone) or allow (each instant runs under a lock of its own, at most --limit at once, 64 without one)' -r
complete -c cronlock -l catch-up -d 'With --schedule: run the latest instant within DURATION before now (Redis\'s clock) that has not run yet, once; older ones nobody ran are recorded as missed, never run' -r
complete -c cronlock -l retries -d 'With --catch-up: run an instant whose attempt failed (non-zero exit) or was abandoned (its host died) up to N more times, by later firings inside the window [default: 0]' -r
complete -c cronlock -s E -l conflict-exit-code -d 'Exit status when the lock is held elsewhere (or the instant already ran, nothing is due, KEY is suspended) and the command does not run' -r
complete -c cronlock -s c -l command -d 'Run SHELL_COMMAND with /bin/sh -c instead of COMMAND' -r
complete -c cronlock -l prefix -d 'Namespace for cronlock\'s Redis keys' -r
complete -c cronlock -l connect-timeout -d 'Timeout for connecting to Redis and for each Redis command outside the watchdog' -r
complete -c cronlock -l min-replicas -d 'Run the command only once N replicas acknowledged the lock (WAIT), and count a renewal only once N replicas have it too' -r
complete -c cronlock -l history -d 'How many past run records to keep per KEY (0: only the last run); with --status, show the kept runs (all, or the last N)' -r
complete -c cronlock -l history-ttl -d 'Expire the last-run record and history this long after the last run [default: never]' -r
complete -c cronlock -l metrics-dir -d 'After every attempt, write KEY\'s metrics to DIR/cronlock_KEY.prom (Prometheus text format, for node_exporter\'s textfile collector): outcome, last run, last success' -r -f -a "(__fish_complete_directories)"
complete -c cronlock -l ping -d 'Healthchecks-style pings: URL/start when the command starts, URL on exit 0, URL/N on status N; nothing when another host runs the job. Never printed; never changes the exit status' -r -f
complete -c cronlock -l ping-url-file -d 'Read the --ping URL from this file instead (surrounding whitespace trimmed), so it shows in no command line or environment; owned by this user or root, writable by nobody else' -r -F
complete -c cronlock -l keep-output -d 'Keep the last SIZE of the command\'s output (stdout and stderr, as lines marked with their stream) with the run\'s record in Redis, for a run that did not succeed; SIZE,all keeps every run\'s; 0 keeps none [default: 4KiB]' -r
complete -c cronlock -l log-format -d 'Format of cronlock\'s own messages on stderr' -r -f -a "text\t'`cronlock: ...` lines'
json\t'one JSON object per line'"
complete -c cronlock -l max-age -d 'With --check: how old the last run may be (with --schedule: how long after an instant its run may take to start)' -r
complete -c cronlock -l reason -d 'With --suspend or --trigger: why, for whoever reads --status, --check or a skipped firing\'s -v line' -r
complete -c cronlock -l for -d 'With --suspend: end the suspension by itself after DURATION (on Redis\'s clock); the first instant after it runs. --resume still ends it early' -r
complete -c cronlock -l token -d 'With --force-release: release only the holder with this token (its CRONLOCK_TOKEN, shown by --status)' -r
complete -c cronlock -l crontab -d 'Run the jobs of this crontab as one of any number of equal replicas: each instant of each job runs once across them; a line is `SCHEDULE [OPTIONS] KEY COMMAND-LINE`' -r -F
complete -c cronlock -l max-jobs -d 'With --crontab: runs this replica supervises at once (and claims in flight); a due job waits for room here or on another replica, and is given up only when it can no longer start' -r
complete -c cronlock -l drain -d 'With --crontab: how long running jobs may go on after SIGTERM or SIGINT before they are stopped (SIGTERM, --grace, SIGKILL)' -r
complete -c cronlock -l listen -d 'With --crontab: serve /metrics (Prometheus), /healthz, /readyz and a status page at / on this address (HOST:PORT, or :PORT for every interface), read-only' -r
complete -c cronlock -l next -d 'Print the next instants of a cron schedule as cronlock runs them, in the schedule\'s time zone with UTC beside, daylight-saving changes marked; then exit' -r
complete -c cronlock -l count -d 'With --next: how many instants to print' -r
complete -c cronlock -l key -d 'With --next: the KEY whose H fields to draw (no variable: CRONLOCK_KEY is the command\'s)' -r
complete -c cronlock -l from -d 'With --next: from this time on (instants at or after it): an RFC 3339 time (2026-03-29T00:00:00Z), or a date, or a date and time, in the schedule\'s time zone (2026-03-29, 2026-03-29 01:30) [default: now]' -r
complete -c cronlock -s n -l nonblock -d 'Do not wait for a busy lock, like flock -n (same as --wait 0)'
complete -c cronlock -s q -l quiet -d 'Print only errors'
complete -c cronlock -s v -l verbose -d 'Also report a busy lock, acquisition, release and renewals'
complete -c cronlock -l ping-body -d 'With --ping: send the last 10 KiB of the command\'s output (stdout and stderr) as the final ping\'s body; the output then passes through cronlock on its way to yours'
complete -c cronlock -l status -d 'Show whether KEY is held, by whom, and its last run; then exit'
complete -c cronlock -l check -d 'Monitoring plugin: judge KEY\'s last run from its record in Redis and exit 0 OK, 1 WARNING, 2 CRITICAL or 3 UNKNOWN, with one line on stdout (Nagios conventions)'
complete -c cronlock -l list -d 'List every lock currently held, and every KEY suspended, under --prefix; then exit'
complete -c cronlock -l force-release -d 'Delete KEY\'s lock whoever holds it (the holder\'s command is then stopped, exit 122)'
complete -c cronlock -l suspend -d 'Suspend KEY across the fleet until --resume: every firing skips with the -E status (a running command goes on), and the instants that pass meanwhile are recorded skipped and never caught up; then exit'
complete -c cronlock -l resume -d 'End KEY\'s suspension: the next due instant runs; then exit'
complete -c cronlock -l trigger -d 'Ask the --crontab fleet serving KEY to run it once now, as a manual instant, under its own lock, suspension, --limit and --retries; exit 0 once a replica took it (with --wait: the command\'s status, 124 when the wait runs out), -E\'s status when it is skipped, 69 when no replica serving KEY took it within 10 s (within --wait, when shorter)'
complete -c cronlock -l json -d 'Print --status, --list, --force-release, --suspend, --resume and --next results as JSON'
complete -c cronlock -l test -d 'With --crontab: read and check FILE as a replica would (its owner, every line, every option against the others), print each job with its next instant, and exit: 0, or 125 with FILE:LINE: message. Runs nothing and needs no Redis'
complete -c cronlock -l show-output -d 'With --crontab and --listen: show on the status page the output each job\'s last failed run kept (--keep-output). Off by default: a job\'s output may hold secrets, and the page is read-only but not private'
complete -c cronlock -s h -l help -d 'Print help (see more with \'--help\')'
complete -c cronlock -s V -l version -d 'Print version'
