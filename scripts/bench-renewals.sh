#!/usr/bin/env bash
# What long runs' renewals cost Redis, this build against another (OTHER, e.g. the previous
# main's), as a Markdown report. Each round runs every build once in a random order: 3 replicas
# of `cronlock --crontab` serving JOBS jobs due every 20 s, each command sleeping 12 s under
# --ttl 6s (a renewal every 1.46 s: about 8 a run), for one instant, on one loopback
# redis-server (flushed between runs). Measured over the runs' life: Redis CPU per renewal
# (INFO cpu deltas, Redis's idle housekeeping over the same time subtracted), the connections
# Redis accepted, and, in a last run of each build under MONITOR, the renewal calls and how many
# separate writes (client, send time to the millisecond) carried them.
# Usage: scripts/bench-renewals.sh OTHER_BIN [ROUNDS] [JOBS] (default 3 rounds of 60 jobs).
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
OTHER=${1:?usage: scripts/bench-renewals.sh OTHER_BIN [ROUNDS] [JOBS]}
ROUNDS=${2:-3}
JOBS=${3:-60}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis
bench_two_builds "$OTHER"

echo "CRON_TZ=UTC" > "$WORK/crontab"
for j in $(seq "$JOBS"); do
  echo "*/20 * * * * * --ttl 6s --connect-timeout 1s long-$j sh -c 'sleep 12; echo done >> $WORK/runs'" >> "$WORK/crontab"
done
conns() { R info stats | awk -F: '/^total_connections_received:/ {print $2 + 0}'; }

# One life: BUILD's 3 replicas from 2 s before an instant until its runs ended; prints
# "RUNS CPU_SECONDS WALL_SECONDS CONNECTIONS".
life() {
  local build=$1 pids=() c0 c1 t0 t1 n0 n1
  R flushall >/dev/null
  : > "$WORK/runs"
  python3 -c 'import time; time.sleep(20 - time.time() % 20 - 2 if time.time() % 20 < 18 else 38 - time.time() % 20)'
  c0=$(cpu); t0=$(date +%s.%N); n0=$(conns)
  for _ in 1 2 3; do
    "$WORK/$build" --crontab "$WORK/crontab" --max-jobs 64 >/dev/null 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 300); do
    [ "$(wc -l < "$WORK/runs")" -ge "$JOBS" ] && break
    sleep 0.1
  done
  kill -TERM "${pids[@]}"
  wait "${pids[@]}" || true
  c1=$(cpu); t1=$(date +%s.%N); n1=$(conns)
  echo "$(wc -l < "$WORK/runs") $c1 $c0 $t1 $t0 $n1 $n0" |
    awk '{printf "%d %.4f %.3f %d\n", $1, $2 - $3, $4 - $5, $6 - $7}'
}

bench_idle
: > "$WORK/rounds"
for round in $(seq "$ROUNDS"); do
  for build in $(printf 'this\nother\n' | shuf); do
    echo "$build $(life "$build")" >> "$WORK/rounds"
  done
done

echo "## Long runs' renewals: $JOBS runs of 12 s under --ttl 6s on 3 replicas"
echo
echo "$(nproc) cores, $(redis-server --version | cut -d' ' -f3), $ROUNDS interleaved rounds, $(date -u +%F)"
echo
echo "| build | runs | Redis CPU per run (ms), median (range) | connections accepted, median |"
echo "|---|---|---|---|"
python3 - "$WORK/rounds" "$IDLE" <<'PY'
import sys, statistics
idle = float(sys.argv[2])
per = {}
for line in open(sys.argv[1]):
    build, runs, cpu, wall, conns = line.split()
    net = float(cpu) - idle * float(wall)
    per.setdefault(build, []).append((int(runs), net / int(runs) * 1000, int(conns)))
for build in ("this", "other"):
    xs = per[build]
    cpu = [x[1] for x in xs]
    print(f"| {build} | {xs[0][0]} | {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) "
          f"| {statistics.median([x[2] for x in xs]):.0f} |")
PY
echo
echo "| build | renewal calls | writes carrying them | clients that renewed |"
echo "|---|---|---|---|"
for build in this other; do
  R flushall >/dev/null
  redis-cli -p "$P" monitor > "$WORK/monitor" &
  mon=$!
  sleep 0.3
  life "$build" >/dev/null
  sleep 0.3
  kill "$mon"; wait "$mon" 2>/dev/null || true
  python3 - "$build" "$WORK/monitor" <<'PY'
import sys, re
build, path = sys.argv[1], sys.argv[2]
calls, writes, clients = 0, set(), set()
for line in open(path, errors="replace"):
    m = re.match(r'(\d+\.\d{3})\d* \[\d+ ([^\]]+)\] "EVAL(?:SHA)?" "[^"]*" "1" "[^"]*long-', line)
    if m:
        calls += 1
        writes.add((m[2], m[1]))
        clients.add(m[2])
print(f"| {build} | {calls} | {len(writes)} | {len(clients)} |")
PY
done
