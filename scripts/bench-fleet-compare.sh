#!/usr/bin/env bash
# This build's `cronlock --crontab` against another build (OTHER, e.g. the previous main's), as a
# Markdown report, interleaved: each round runs every (build, fleet size) once in random order,
# 20 jobs every second on one loopback redis-server (flushed between runs), and measures over
# 8 s of steady service (from 3 s after the replicas started):
#   - Redis CPU per run (INFO cpu deltas),
#   - start delay p50/p99 (from the instant to the command's start),
# then over 4 s more, Redis client commands per run (MONITOR, in a window of its own since it
# costs Redis CPU; the scripts' own calls left out),
# then, once per build, the share of runs started within 1 s at 200, 300 and 400 jobs every
# second on 3 replicas (10 s each).
# Usage: scripts/bench-fleet-compare.sh OTHER_BIN [ROUNDS] (default 5 rounds).
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
OTHER=${1:?usage: scripts/bench-fleet-compare.sh OTHER_BIN [ROUNDS]}
ROUNDS=${2:-5}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis

# A crontab of N jobs every second, each appending "INSTANT START" to FILE.
jobs_every_second() {
  echo "CRON_TZ=UTC"
  for j in $(seq "$1"); do
    echo "* * * * * * c$1-$j echo \$CRONLOCK_INSTANT \$(date +%s.%N) >> $2"
  done
}
# Start N replicas of BIN serving FILE; their pids in $WORK/replicas.
start_replicas() {
  local bin=$1 n=$2 file=$3
  : > "$WORK/replicas"
  for i in $(seq "$n"); do
    "$bin" --crontab "$file" >/dev/null 2>"$WORK/r$i.err" &
    echo $! >> "$WORK/replicas"
  done
}
stop_replicas() {
  while read -r p; do kill -TERM "$p" 2>/dev/null || true; done < "$WORK/replicas"
  while read -r p; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done < "$WORK/replicas"
}
on_the_second() { python3 -c 'import time; time.sleep(1.05 - time.time() % 1)'; }

# One measured run: BUILD (this|other) and N replicas; prints "CMDS_PER_RUN CPU_MS_PER_RUN P50 P99".
measure() {
  local bin=$BIN; [ "$1" = other ] && bin=$OTHER
  local n=$2 runs="$WORK/runs" file="$WORK/crontab"
  R flushall >/dev/null
  : > "$runs"
  jobs_every_second 20 "$runs" > "$file"
  on_the_second
  start_replicas "$bin" "$n" "$file"
  sleep 3
  local from to c0 c1 before after
  before=$(wc -l < "$runs")
  c0=$(cpu)
  from=$(date +%s)
  sleep 8
  to=$(date +%s)
  c1=$(cpu)
  after=$(wc -l < "$runs")
  # The commands in a window of their own (MONITOR costs Redis more than the fleet does).
  local mb ma cmds
  mb=$(wc -l < "$runs")
  timeout 4 redis-cli -p "$P" monitor > "$WORK/monitor" 2>/dev/null || true
  ma=$(wc -l < "$runs")
  stop_replicas
  # Client commands only: the scripts' own calls are marked "[0 lua]".
  cmds=$(grep -vc '\[0 lua\]' "$WORK/monitor" || true)
  awk -v f="$from" -v t="$to" '{split($2, s, "."); if (s[1] >= f && s[1] < t) print}' "$runs" \
    > "$WORK/window"
  local d
  d=$(bench_delays "$WORK/window")
  python3 - "$cmds" "$((ma - mb))" "$c0" "$c1" "$((after - before))" "$d" <<'PY'
import sys
cmds, monitored = int(sys.argv[1]), max(int(sys.argv[2]), 1)
c0, c1, runs = float(sys.argv[3]), float(sys.argv[4]), max(int(sys.argv[5]), 1)
d = sys.argv[6].split()
print(f"{cmds / monitored:.3f} {(c1 - c0) * 1000 / runs:.4f} {d[1]} {d[3]}")
PY
}

# The share of runs started within 1 s at RATE jobs every second, 3 replicas, 10 s.
sustained() {
  local bin=$BIN; [ "$1" = other ] && bin=$OTHER
  local rate=$2 runs="$WORK/runs" file="$WORK/crontab"
  R flushall >/dev/null
  : > "$runs"
  jobs_every_second "$rate" "$runs" > "$file"
  on_the_second
  start_replicas "$bin" 3 "$file"
  local from=$(( $(date +%s) + 3 ))
  sleep 13
  local to=$(( $(date +%s) - 1 ))
  stop_replicas
  python3 - "$runs" "$from" "$to" "$rate" <<'PY'
import sys, datetime
path, f, t, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ok = 0
for line in open(path):
    inst, start = line.split()[:2]
    at = datetime.datetime.fromisoformat(inst.replace("Z", "+00:00")).timestamp()
    if f <= at < t and float(start) - at <= 1.0:
        ok += 1
want = rate * (t - f)
print(f"{100 * ok / max(want, 1):.1f}")
PY
}

echo "## cronlock --crontab: this build against another"
echo
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), $(date -u +%F);" \
  "this: $("$BIN" --version), other: $OTHER; $ROUNDS interleaved rounds"
echo
: > "$WORK/results"
for round in $(seq "$ROUNDS"); do
  for v in "this 3" "other 3" "this 10" "other 10"; do echo "$v"; done | shuf > "$WORK/order"
  while read -r build n; do
    echo "round $round: $build, $n replicas" >&2
    echo "$build $n $(measure "$build" "$n")" >> "$WORK/results"
  done < "$WORK/order"
done
echo "| build | replicas | client commands per run | Redis CPU per run (ms) | start delay p50 / p99 (ms) |"
echo "|---|---|---|---|---|"
python3 - "$WORK/results" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    b, n, cmds, cpu, p50, p99 = line.split()
    rows.setdefault((b, int(n)), []).append((float(cmds), float(cpu), float(p50), float(p99)))
def show(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"
for n in (3, 10):
    for b in ("this", "other"):
        r = rows.get((b, n), [])
        if not r:
            continue
        cols = list(zip(*r))
        print(f"| {b} | {n} | {show(cols[0])} | {show(cols[1])} | "
              f"{statistics.median(cols[2]):.1f} / {statistics.median(cols[3]):.1f} |")
PY
echo
echo "Median (min-max) over the rounds."
echo
echo "| build | 200 jobs/s | 300 jobs/s | 400 jobs/s |"
echo "|---|---|---|---|"
for build in this other; do
  row="| $build |"
  for rate in 200 300 400; do
    echo "sustained: $build, $rate jobs/s" >&2
    row="$row $(sustained "$build" "$rate")% |"
  done
  echo "$row"
done
echo
echo "Share of the runs due (3 replicas, 10 s, the first 3 s left out) that started within 1 s."
