#!/usr/bin/env bash
# Whether a fleet's Redis cost follows its size, this build against another (OTHER, e.g. the
# previous main's), as a Markdown report. Each round runs every (build, fleet size) once in a
# random order: 3 or 10 replicas of `cronlock --crontab` started together, 20 jobs every second,
# drained (SIGTERM) after SECS seconds, on one loopback redis-server (flushed between runs).
# Over the whole life of the fleet (its start and drain included) it measures Redis CPU per run
# (INFO cpu deltas, Redis's idle housekeeping over the same time measured first and subtracted)
# and, in a last round of its own (MONITOR costs Redis CPU), Redis client commands per run (the
# scripts' own calls left out) by kind: claims, releases, heartbeats, checks.
# Usage: scripts/bench-fleet-size.sh OTHER_BIN [ROUNDS] [SECS] (default 5 rounds of 12 s).
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
OTHER=${1:?usage: scripts/bench-fleet-size.sh OTHER_BIN [ROUNDS] [SECS]}
ROUNDS=${2:-5}
SECS=${3:-12}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis
bench_two_builds "$OTHER"

echo "CRON_TZ=UTC" > "$WORK/crontab"
for j in $(seq 20); do
  echo "* * * * * * s-$j echo \$CRONLOCK_INSTANT \$(date +%s.%N) >> $WORK/runs" >> "$WORK/crontab"
done

# One fleet's life: BUILD N replicas for SECS, drained; prints "RUNS CPU_SECONDS WALL_SECONDS".
life() {
  local build=$1 n=$2 pids=() c0 c1 t0 t1
  R flushall >/dev/null
  : > "$WORK/runs"
  c0=$(cpu); t0=$(date +%s.%N)
  for _ in $(seq "$n"); do
    "$WORK/$build" --crontab "$WORK/crontab" --max-jobs 64 >/dev/null 2>&1 &
    pids+=($!)
  done
  sleep "$SECS"
  kill -TERM "${pids[@]}"
  wait "${pids[@]}" || true
  c1=$(cpu); t1=$(date +%s.%N)
  echo "$(wc -l < "$WORK/runs") $c1 $c0 $t1 $t0" | awk '{printf "%d %.4f %.3f\n", $1, $2 - $3, $4 - $5}'
}

bench_idle
: > "$WORK/rounds"
for round in $(seq "$ROUNDS"); do
  for v in $(printf 'this 3\nthis 10\nother 3\nother 10\n' | shuf | tr ' ' ':'); do
    echo "${v%%:*} ${v##*:} $(life "${v%%:*}" "${v##*:}")" >> "$WORK/rounds"
  done
done

echo "## A fleet's Redis cost by its size, whole life (start and drain included)"
echo
echo "$(nproc) cores, $(redis-server --version | cut -d' ' -f3), 20 jobs every second, $SECS s a life, $ROUNDS interleaved rounds, $(date -u +%F)"
echo
python3 - "$WORK/rounds" "$IDLE" <<'PY'
import sys, statistics
idle = float(sys.argv[2])
per = {}
for line in open(sys.argv[1]):
    build, n, runs, cpu, wall = line.split()
    net = float(cpu) - idle * float(wall)
    per.setdefault((build, int(n)), []).append(net / int(runs) * 1000)
print("| build | Redis CPU per run, 3 replicas | 10 replicas | 10 / 3 |")
print("|---|---|---|---|")
for build in ("this", "other"):
    a, b = per[(build, 3)], per[(build, 10)]
    show = lambda xs: f"{statistics.median(xs):.3f} ms ({min(xs):.3f}-{max(xs):.3f})"
    print(f"| {build} | {show(a)} | {show(b)} | {statistics.median(b) / statistics.median(a):.2f}x |")
PY
echo

echo "Client commands per run over one life each (MONITOR):"
echo
echo "| build | replicas | runs | per run | claims | releases | heartbeats | checks | other |"
echo "|---|---|---|---|---|---|---|---|---|"
for build in this other; do
  for n in 3 10; do
    R flushall >/dev/null
    redis-cli -p "$P" monitor > "$WORK/monitor" &
    mon=$!
    sleep 0.3
    out=$(life "$build" "$n")
    sleep 0.3
    kill "$mon"; wait "$mon" 2>/dev/null || true
    runs=${out%% *}
    python3 - "$build" "$n" "$runs" "$WORK/monitor" <<'PY'
import sys, re, collections
build, n, runs, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
kinds = collections.Counter()
for line in open(path, errors="replace"):
    if not re.match(r"\d", line) or " lua]" in line:
        continue
    if '"EVALSHA"' in line or '"EVAL"' in line:
        if ":members" in line:
            kinds["beat"] += 1
        elif ':history"' in line:
            kinds["release"] += 1
        elif ':fence"' in line:
            kinds["claim"] += 1
        elif re.search(r'"EVALSHA" "\w+" "\d+" "[^"]*:schedule" "[^"]*:ledger"', line):
            kinds["check"] += 1
        else:
            kinds["other"] += 1
    elif '"monitor"' not in line.lower():
        kinds["other"] += 1
total = sum(kinds.values())
f = lambda k: f"{kinds[k] / runs:.2f}"
print(f"| {build} | {n} | {runs} | **{total / runs:.2f}** | {f('claim')} | {f('release')} | {f('beat')} | {f('check')} | {f('other')} |")
PY
  done
done
