#!/usr/bin/env bash
# The cost of `cronlock --crontab`, with replicas as separate processes against one loopback
# redis-server, as a Markdown report:
#   1. Redis client commands per scheduled run, 20 jobs every second, 3 and 10 replicas (MONITOR,
#      the scripts' own calls left out);
#   2. interleaved rounds (each round runs 1, 3 and 10 replicas once, in random order, 20 jobs
#      every second for about 12 s): fleet CPU per run (the replicas and everything they reaped,
#      from their rusage) and Redis's CPU per run (INFO cpu deltas, Redis's idle housekeeping over
#      the same time measured first and subtracted), over the whole round and over 8 s of steady
#      service; medians and spreads;
#   3. delay from the instant to the command's start, 5 jobs every second (p50/p99 over SECS
#      seconds, 3 replicas) and 20 jobs at each instant;
#   4. sustained: 200 and 300 jobs every second on 3 replicas, the share started within 1 s;
#   5. 1,000 jobs due at the same instant on 3 replicas: each once, and when the last started;
#   6. a replica's RSS (and its children's), idle, with 1,000 jobs, and how long 20,000 take to read.
# Installs redis-server and redis-tools when missing.
# Usage: scripts/bench-crontab.sh [SECS] [ROUNDS] (SECS for 3, default 200: 1,000 runs;
# ROUNDS for 2, default 7). SECTIONS="4 5" runs only those; SUSTAINED="200 300 500" sets the
# rates of 4.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-200}
ROUNDS=${2:-7}
. scripts/bench-common.sh
want() { [[ " ${SECTIONS:-1 2 3 4 5 6} " == *" $1 "* ]]; }
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis

# Start N replicas of FILE with more options; pids in $WORK/replicas, each replica's rusage
# (user and system seconds, its reaped runs included) in $WORK/time.I when it ends. The wrapper
# passes SIGTERM on and counts only its child's time, not its own.
cat > "$WORK/rusage.py" <<'PY'
import resource, signal, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: p.send_signal(signal.SIGTERM))
p.wait()
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(f"{r.ru_utime} {r.ru_stime}\n")
PY
start_replicas() {
  local n=$1 file=$2; shift 2
  : > "$WORK/replicas"
  rm -f "$WORK"/time.*
  for i in $(seq "$n"); do
    python3 "$WORK/rusage.py" "$WORK/time.$i" "$BIN" --crontab "$file" "$@" \
      >"$WORK/r$i.out" 2>"$WORK/r$i.err" &
    echo $! >> "$WORK/replicas"
  done
}
stop_replicas() {
  while read -r p; do kill -TERM "$p" 2>/dev/null || true; done < "$WORK/replicas"
  while read -r p; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done < "$WORK/replicas"
}
fleet_cpu() { cat "$WORK"/time.* | awk '{s += $1 + $2} END {printf "%.4f", s}'; }

# A crontab of N jobs every second, each appending "INSTANT START KEY" to FILE.
jobs_every_second() {
  {
    echo "CRON_TZ=UTC"
    for j in $(seq "$1"); do
      echo "* * * * * * j$1-$j echo \$CRONLOCK_INSTANT \$(date +%s.%N) j$1-$j >> $2"
    done
  }
}
# Wait until just after a second starts.
on_the_second() { python3 -c 'import time; time.sleep(1.05 - time.time() % 1)'; }

echo "## cronlock --crontab benchmark"
echo
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), cronlock $("$BIN" --version | cut -d' ' -f2), $(date -u +%F)"
echo

if want 1; then
# 1. Client commands per run.
echo "### 1. Redis client commands per scheduled run (20 jobs every second, 15 s, MONITOR)"
echo
jobs_every_second 20 "$WORK/mon.runs" > "$WORK/mon.crontab"
for n in 3 10; do
  : > "$WORK/mon.runs"
  redis-cli -p "$P" monitor > "$WORK/monitor" &
  mon=$!
  sleep 0.5
  start_replicas "$n" "$WORK/mon.crontab" --max-jobs 64
  sleep 15
  stop_replicas
  sleep 0.5
  kill "$mon"; wait "$mon" 2>/dev/null || true
  runs=$(wc -l < "$WORK/mon.runs")
  # A client's command shows its address; a script's own calls show "lua".
  grep -av ' lua\]' "$WORK/monitor" | grep -a '^[0-9]' | awk '{print $4}' | sort | uniq -c \
    > "$WORK/mon.kinds"
  total=$(awk '{s += $1} END {print s}' "$WORK/mon.kinds")
  python3 - "$n" "$runs" "$total" "$WORK/mon.kinds" <<'PY'
import sys
n, runs, total = (int(x) for x in sys.argv[1:4])
kinds = ", ".join(f"{c} {k}" for c, k in (l.split() for l in open(sys.argv[4])))
print(f"- {n} replicas: {runs} runs, {total} client commands ({kinds}): **{total / runs:.2f} "
      f"per run** (a claim, a release, and the heartbeats: each replica's every second up to 3 "
      f"replicas, every N/3 s above).")
PY
done
echo

fi
if want 2; then
# 2. Interleaved CPU rounds.
echo "### 2. CPU per run: 1, 3 and 10 replicas, interleaved"
echo
jobs_every_second 20 "$WORK/cpu.runs" > "$WORK/cpu.crontab"
# Redis's idle housekeeping per second, no client connected.
c0=$(cpu); sleep 8; c1=$(cpu)
idle=$(python3 -c "print(($c1 - $c0) / 8)")
: > "$WORK/rounds"
for round in $(seq "$ROUNDS"); do
  for n in $(printf '1\n3\n10\n' | shuf); do
    : > "$WORK/cpu.runs"
    on_the_second
    c0=$(cpu); t0=$(date +%s.%N)
    start_replicas "$n" "$WORK/cpu.crontab" --max-jobs 64
    # Steady: from half a second after the third instant, for 8 instants.
    sleep 2; python3 -c 'import time; time.sleep(1.5 - time.time() % 1)'
    ra=$(wc -l < "$WORK/cpu.runs"); ca=$(cpu); ta=$(date +%s.%N)
    sleep 8
    rb=$(wc -l < "$WORK/cpu.runs"); cb=$(cpu); tb=$(date +%s.%N)
    stop_replicas
    c1=$(cpu); t1=$(date +%s.%N)
    echo "$n $(wc -l < "$WORK/cpu.runs") $(fleet_cpu) $c0 $c1 $t0 $t1 $((rb - ra)) $ca $cb $ta $tb" \
      >> "$WORK/rounds"
  done
done
python3 - "$WORK/rounds" "$idle" <<'PY'
import sys, statistics
idle = float(sys.argv[2])
per = {}
for line in open(sys.argv[1]):
    n, runs, fleet, c0, c1, t0, t1, sruns, ca, cb, ta, tb = line.split()
    runs, sruns = int(runs), int(sruns)
    redis = float(c1) - float(c0) - idle * (float(t1) - float(t0))
    steady = float(cb) - float(ca) - idle * (float(tb) - float(ta))
    per.setdefault(int(n), []).append((float(fleet) / runs * 1000, redis / runs * 1000, runs,
                                       steady / sruns * 1000))
def show(xs):
    return f"median **{statistics.median(xs):.3f}** (min {min(xs):.3f}, max {max(xs):.3f})"
print(f"{len(per[1])} rounds, each running 1, 3 and 10 replicas in random order; Redis's idle "
      f"housekeeping ({idle * 1000:.2f} ms of CPU a second) subtracted. A round: the replicas "
      f"start, serve for 11.5 s to 12.5 s and stop; \"whole round\" counts all of it (starts and "
      f"drains included), \"steady\" the 8 s from half a second after their third instant.")
print()
print("| replicas | runs a round | fleet CPU per run (ms) | Redis CPU per run, whole round (ms) "
      "| Redis CPU per run, steady (ms) |")
print("|---|---|---|---|---|")
for n in sorted(per):
    rows = per[n]
    print(f"| {n} | {statistics.median(r[2] for r in rows):.0f} | {show([r[0] for r in rows])} "
          f"| {show([r[1] for r in rows])} | {show([r[3] for r in rows])} |")
one = [r[0] for r in per[1]]
for n in (3, 10):
    ratios = [a[0] / b for a, b in zip(per[n], one)]
    print()
    print(f"Fleet CPU per run, {n} replicas / 1 (round by round): median **{statistics.median(ratios):.2f}x** "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}).")
PY
echo

fi
if want 3; then
# 3. Start delay.
delays() { # FILE LABEL
  local runs p50 p90 p99 max
  read -r runs p50 p90 p99 max < <(bench_delays "$1")
  printf -- '- %s: %s runs, p50 **%.1f ms**, p90 %.1f ms, p99 **%.1f ms**, max %.1f ms.\n' \
    "$2" "$runs" "$p50" "$p90" "$p99" "$max"
}
echo "### 3. Delay from the instant to the command's start (3 replicas)"
echo
echo "The command is \`echo \$CRONLOCK_INSTANT \$(date +%s.%N)\` under \`/bin/sh -c\`: the delay includes the shell and \`date\`."
echo
for spec in "5 $SECS" "20 20"; do
  set -- $spec
  jobs_every_second "$1" "$WORK/delay$1" > "$WORK/delay$1.crontab"
  : > "$WORK/delay$1"
  start_replicas 3 "$WORK/delay$1.crontab"
  sleep "$2"
  stop_replicas
  # The first and last instants met replicas starting or stopping.
  sort "$WORK/delay$1" | awk -v n="$1" 'NR > 2 * n' | head -n -"$((2 * $1))" > "$WORK/delay$1.mid"
  delays "$WORK/delay$1.mid" "$1 jobs at each instant"
done
echo

fi
if want 4; then
# 4. Sustained.
echo "### 4. Sustained: N jobs every second on 3 replicas, 15 s"
echo
for n in ${SUSTAINED:-200 300}; do
  jobs_every_second "$n" "$WORK/sus$n" > "$WORK/sus$n.crontab"
  : > "$WORK/sus$n"
  start_replicas 3 "$WORK/sus$n.crontab" --max-jobs 1024
  sleep 15
  stop_replicas
  python3 - "$WORK/sus$n" "$n" <<'PY'
import sys, datetime, collections
rows = [l.split() for l in open(sys.argv[1])]
n = int(sys.argv[2])
insts = sorted({r[0] for r in rows})[2:-2]
keep = set(insts)
late = lambda r: float(r[1]) - datetime.datetime.fromisoformat(r[0].replace("Z", "+00:00")).timestamp()
mid = [r for r in rows if r[0] in keep]
ok = sum(1 for r in mid if late(r) <= 1.0)
twice = sum(1 for c in collections.Counter((r[0], r[2]) for r in rows).values() if c > 1)
due = len(insts) * n
print(f"- {n} a second: {len(insts)} whole instants, {due} runs due, {len(mid)} ran, "
      f"**{ok / due * 100:.1f}% started within 1 s**; {twice} ran twice.")
PY
done
echo

fi
if want 5; then
# 5. 1,000 at once.
echo "### 5. 1,000 jobs due at the same instant on 3 replicas (default --max-jobs 16)"
echo
{
  echo "CRON_TZ=UTC"
  for j in $(seq 1000); do
    echo "*/10 * * * * * k$j echo \$CRONLOCK_INSTANT \$(date +%s.%N) k$j >> $WORK/burst"
  done
} > "$WORK/burst.crontab"
: > "$WORK/burst"
start_replicas 3 "$WORK/burst.crontab"
sleep 25
stop_replicas
python3 - "$WORK/burst" <<'PY'
import sys, datetime, collections
by = collections.defaultdict(list)
for inst, start, key in (l.split() for l in open(sys.argv[1])):
    t = datetime.datetime.fromisoformat(inst.replace("Z", "+00:00")).timestamp()
    by[inst].append((float(start) - t, key))
for inst, rows in sorted(by.items()):
    keys = collections.Counter(k for _, k in rows)
    d = sorted(x for x, _ in rows)
    print(f"- {inst}: {len(rows)} runs of {len(keys)} jobs ({sum(1 for c in keys.values() if c > 1)} "
          f"twice); half started within {d[len(d) // 2]:.2f} s, **the last after {d[-1]:.2f} s**.")
PY
echo

fi
if want 6; then
# 6. Idle memory and reading.
echo "### 6. An idle replica"
echo
for n in 1000 20000; do
  for j in $(seq "$n"); do echo "0 0 1 1 * idle$j /bin/true"; done > "$WORK/idle$n.crontab"
  t0=$(date +%s.%N)
  "$BIN" --crontab "$WORK/idle$n.crontab" >"$WORK/idle.out" 2>"$WORK/idle.err" &
  pid=$!
  until grep -q "serving $n jobs" "$WORK/idle.err" 2>/dev/null; do sleep 0.01; done
  t1=$(date +%s.%N)
  sleep 1
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  # Its children (a starter, if it kept one while idle): their RSS too.
  kids=0
  for c in $(cat "/proc/$pid/task/$pid/children"); do
    kids=$((kids + $(awk '/^VmRSS/ {print $2}' "/proc/$c/status")))
  done
  kill -TERM "$pid"; wait "$pid" || true
  python3 - "$n" "$rss" "$t0" "$t1" "$kids" <<'PY'
import sys
n, rss = int(sys.argv[1]), int(sys.argv[2]); t0, t1 = float(sys.argv[3]), float(sys.argv[4])
kids = int(sys.argv[5])
print(f"- {n:,} jobs (one expression): RSS **{rss / 1024:.1f} MiB** (VmRSS, idle), its children "
      f"{kids / 1024:.1f} MiB; read and checked in **{(t1 - t0) * 1000:.0f} ms**.")
PY
done
fi
