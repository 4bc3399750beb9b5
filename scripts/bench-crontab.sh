#!/usr/bin/env bash
# The cost of `cronlock --crontab`, with replicas as separate processes against one loopback
# redis-server, as a Markdown report:
#   1. Redis client commands per scheduled run with 3 replicas (INFO commandstats);
#   2. delay from the instant to the command's start, p50/p99 over 1,000 runs (5 jobs every
#      second for 200 s, 3 replicas), and with 20 jobs at each instant (20 s);
#   3. sustained scheduled runs per second with 3 replicas and 200 jobs every second, with
#      Redis's CPU;
#   4. a replica's RSS, idle, with 1,000 jobs in its file (and how long it takes to read them).
# Installs redis-server and redis-tools when missing. Usage: scripts/bench-crontab.sh [seconds]
# (the length of runs 1 and 2, default 200: 1,000 runs).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-200}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
P=$(free_port)
redis-server --port "$P" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$WORK/redis.pid" \
  --dir "$WORK" >/dev/null
export CRONLOCK_REDIS_URL=redis://127.0.0.1:$P
for _ in $(seq 100); do redis-cli -p "$P" ping >/dev/null 2>&1 && break; sleep 0.05; done
R() { redis-cli -p "$P" "$@"; }

# Start N replicas of FILE (pids in $WORK/replicas), logs in $WORK.
start_replicas() {
  : > "$WORK/replicas"
  for i in $(seq "$1"); do
    "$BIN" --crontab "$2" --max-jobs 1024 >"$WORK/r$i.out" 2>"$WORK/r$i.err" &
    echo $! >> "$WORK/replicas"
  done
}
stop_replicas() {
  while read -r p; do kill -TERM "$p" 2>/dev/null || true; done < "$WORK/replicas"
  while read -r p; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done < "$WORK/replicas"
}
# Client commands since the last CONFIG RESETSTAT: scripts, and the others a run sends.
calls() { R info commandstats | awk -F'[_:,=]' -v c="$1" '$2 == c {print $4}'; }

echo "## cronlock --crontab benchmark"
echo
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), cronlock $("$BIN" --version | cut -d' ' -f2), $(date -u +%F)"
echo

# N jobs every second for S seconds, each writing its instant and its start time to FILE.
delay_table() {
  {
    echo "CRON_TZ=UTC"
    for j in $(seq "$1"); do
      echo "* * * * * * d$1-$j echo \$CRONLOCK_INSTANT \$(date +%s.%N) >> $3"
    done
  } > "$WORK/delay$1.crontab"
  start_replicas 3 "$WORK/delay$1.crontab"
  sleep "$2"
  stop_replicas
}
delays() {
  python3 - "$@" <<'PY'
import sys, datetime
d = []
for line in open(sys.argv[1]):
    inst, start = line.split()
    t = datetime.datetime.fromisoformat(inst.replace("Z", "+00:00")).timestamp()
    d.append((float(start) - t) * 1000)
d.sort()
q = lambda p: d[min(len(d) - 1, int(p * len(d)))]
print(f"{len(d)} runs, {sys.argv[2]}: p50 **{q(0.5):.1f} ms**, p90 {q(0.9):.1f} ms, "
      f"p99 **{q(0.99):.1f} ms**, max {d[-1]:.1f} ms.")
PY
}
R config resetstat >/dev/null
delay_table 5 "$SECS" "$WORK/delays5"
runs=$(wc -l < "$WORK/delays5")
evalsha=$(calls evalsha); eval_=$(calls eval); eval_=${eval_:-0}
other=$(R info commandstats | awk -F'[_:,=]' '$2 ~ /^(client|subscribe|ping|hello|auth|select|wait|role|cluster)/ {s += $4} END {print s + 0}')
echo "### 1. Redis client commands per scheduled run (3 replicas, 5 jobs every second, ${SECS} s)"
echo
python3 - "$runs" "$evalsha" "$eval_" "$other" <<'PY'
import sys
runs, evalsha, ev, other = (int(x) for x in sys.argv[1:])
scripts = evalsha + ev
print(f"{runs} runs; scripts (EVALSHA/EVAL): {scripts}, **{scripts / runs:.2f} per run** "
      f"(3 claims, one per replica, and one release make 4); other client commands (the "
      f"lock watch's CLIENT ID, CLIENT TRACKING, SUBSCRIBE, PING): {other}, "
      f"{other / runs:.2f} per run.")
PY
echo
echo "### 2. Delay from the instant to the command's start"
echo
echo "The command is \`date\`, started by \`/bin/sh -c\`; 3 replicas on this machine's cores."
echo
delays "$WORK/delays5" "5 jobs at each instant"
delay_table 20 20 "$WORK/delays20"
echo
delays "$WORK/delays20" "20 jobs at each instant (60 runs of cronlock started each second)"
echo

# 3: 200 jobs every second.
{
  echo "CRON_TZ=UTC"
  for j in $(seq 200); do echo "* * * * * * s$j echo \$CRONLOCK_INSTANT >> $WORK/sustained"; done
} > "$WORK/sustained.crontab"
cpu() { R info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.3f", s}'; }
start_replicas 3 "$WORK/sustained.crontab"
sleep 3
: > "$WORK/sustained"
c0=$(cpu); t0=$(date +%s.%N)
sleep 10
n=$(wc -l < "$WORK/sustained"); c1=$(cpu); t1=$(date +%s.%N)
stop_replicas
echo "### 3. Sustained runs with 3 replicas and 200 jobs every second"
echo
python3 - "$n" "$c0" "$c1" "$t0" "$t1" <<'PY'
import sys
n = int(sys.argv[1]); c0, c1, t0, t1 = (float(x) for x in sys.argv[2:])
secs = t1 - t0
print(f"**{n / secs:.0f} runs per second** of the 200 due (over {secs:.1f} s); Redis used "
      f"{(c1 - c0) / secs * 100:.1f}% of a core for them.")
PY
echo

# 4: 1,000 jobs, none due for a year.
{
  for j in $(seq 1000); do echo "0 0 1 1 * idle$j /bin/true"; done
} > "$WORK/idle.crontab"
t0=$(date +%s.%N)
"$BIN" --crontab "$WORK/idle.crontab" >"$WORK/idle.out" 2>"$WORK/idle.err" &
pid=$!
until grep -q "serving 1000 jobs" "$WORK/idle.err" 2>/dev/null; do sleep 0.01; done
t1=$(date +%s.%N)
sleep 1
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
kill -TERM "$pid"; wait "$pid" || true
echo "### 4. An idle replica with 1,000 jobs"
echo
python3 - "$rss" "$t0" "$t1" <<'PY'
import sys
rss = int(sys.argv[1]); t0, t1 = float(sys.argv[2]), float(sys.argv[3])
print(f"RSS **{rss} KiB** (VmRSS, idle); reading and checking the 1,000 lines took "
      f"{(t1 - t0) * 1000:.0f} ms.")
PY
