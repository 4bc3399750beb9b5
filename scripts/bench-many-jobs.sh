#!/usr/bin/env bash
# What a replica's own loop costs per run as it serves more jobs, as a Markdown report: 3
# replicas against one loopback redis-server, 33 runs due every second, either from 33 jobs due
# every second or from 20,000 jobs each due every 10 minutes (33 of them in each second). Per
# run: the replicas' own CPU (all their threads, from /proc/PID/stat; the runs they start are not
# counted) over SECS seconds of steady service (default 10), from 5 s after the start.
# Interleaved: each round runs every variant once, in random order; medians and ranges.
# Variants: this build and each OTHER_BIN given, with each crontab.
# Usage: scripts/bench-many-jobs.sh [ROUNDS] [OTHER_BIN...] (default 3 rounds); SECS.
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
shift || true
OTHERS=("$@")
SECS=${SECS:-10}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools
bench_setup
bench_redis

# The command is a script of its own, so that 20,000 lines stay under the crontab's 1 MiB.
cat > "$WORK/cmd" <<'SH'
#!/bin/sh
echo "$CRONLOCK_INSTANT" >> "$(dirname "$0")/runs"
SH
chmod +x "$WORK/cmd"
{
  echo CRON_TZ=UTC
  for j in $(seq 33); do echo "* * * * * * e$j $WORK/cmd"; done
} > "$WORK/33.crontab"
{
  echo CRON_TZ=UTC
  for j in $(seq 0 19999); do echo "$((j % 60)) $(((j / 60) % 10))/10 * * * * m$j $WORK/cmd"; done
} > "$WORK/20000.crontab"

# The replicas' own CPU so far, in clock ticks.
own() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}

# One run of BIN on JOBS.crontab: the replicas' own CPU per run (ms).
measure() {
  local bin=$1 jobs=$2 pids=() i a b n0 n1
  R flushall >/dev/null
  : > "$WORK/runs"
  for i in 1 2 3; do
    "$bin" --crontab "$WORK/$jobs.crontab" >/dev/null 2>"$WORK/r$i.err" &
    pids+=($!)
  done
  sleep 5
  a=$(own "${pids[@]}")
  n0=$(wc -l < "$WORK/runs")
  sleep "$SECS"
  b=$(own "${pids[@]}")
  n1=$(wc -l < "$WORK/runs")
  kill -TERM "${pids[@]}"
  wait "${pids[@]}" || true
  python3 -c "print(f'{($b - $a) * 1000 / $(getconf CLK_TCK) / max(1, $n1 - $n0):.3f}')"
}

BINS=("$BIN" "${OTHERS[@]}")
variants=()
for b in "${!BINS[@]}"; do for jobs in 33 20000; do variants+=("$b $jobs"); done; done
declare -A got
for round in $(seq "$ROUNDS"); do
  while read -r v; do
    read -r b jobs <<< "$v"
    got[$v]+="$(measure "${BINS[$b]}" "$jobs") "
  done < <(printf '%s\n' "${variants[@]}" | shuf)
  echo "round $round of $ROUNDS done" >&2
done

echo "## A replica's own CPU per run, by the jobs it serves (33 runs a second, 3 replicas)"
echo
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), $(date -u +%F); $ROUNDS interleaved rounds of $SECS s"
echo
echo "| build | jobs served | replicas' own CPU per run, median (range) |"
echo "|---|---|---|"
for v in "${variants[@]}"; do
  read -r b jobs <<< "$v"
  name=this
  [ "$b" -gt 0 ] && name=${BINS[$b]}
  python3 - "$name" "$jobs" ${got[$v]} <<'PY'
import statistics, sys
name, jobs, xs = sys.argv[1], int(sys.argv[2]), sorted(map(float, sys.argv[3:]))
print(f"| {name} | {jobs:,} | {statistics.median(xs):.3f} ms ({xs[0]:.3f}-{xs[-1]:.3f}) |")
PY
done
