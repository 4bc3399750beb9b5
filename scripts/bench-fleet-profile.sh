#!/usr/bin/env bash
# Where a fleet's CPU per run goes, by process: 3 replicas of this build (and of each OTHER_BIN,
# interleaved: every round runs each build once in a random order) against one loopback Redis,
# RATE jobs every second (each `echo $CRONLOCK_INSTANT $(date +%s.%N) >> F`, #79's load), and
# `perf record -a` of the whole machine for SECS seconds of steady service. Prints, per run, the
# CPU (ms) and the page faults of: the command (sh, date), the runs (a replica's starter and the
# runs it forks: comm `cronlock`), their guards, the replicas' own threads, and Redis; and the
# whole cronlock share over the command's (the command alone is about what #79's floor costs).
# Needs perf (Debian's linux-perf) and a kernel that lets root sample every CPU.
# Usage: scripts/bench-fleet-profile.sh [ROUNDS] [RATE] [SECS] [OTHER_BIN...]   (default 3 200 6)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
RATE=${2:-200}
SECS=${3:-6}
shift $(($# < 3 ? $# : 3))
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc perf:linux-perf
bench_setup
bench_redis
bench_builds "$@"
{
  echo "CRON_TZ=UTC"
  for i in $(seq "$RATE"); do
    echo "* * * * * * job-$i echo \$CRONLOCK_INSTANT \$(date +%s.%N) >> $WORK/out"
  done
} > "$WORK/tab"
echo "| round | build | runs | command | runs (starter + forked runs) | guards | replicas' threads | Redis | cronlock / command |"
echo "|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for b in $(printf '%s\n' "${builds[@]}" | shuf); do
    name=${b%%=*}
    cp "${b#*=}" "$WORK/bin-$name"
    R flushall >/dev/null
    rm -f "$WORK/out"
    pids=()
    for _ in 1 2 3; do
      "$WORK/bin-$name" --crontab "$WORK/tab" >/dev/null 2>&1 &
      pids+=($!)
    done
    # Warm up: every replica in the fleet, its starter started, the jobs' keys made.
    sleep 4
    before=$(wc -l < "$WORK/out")
    perf record -q -a -e cpu-clock -F 2000 -e page-faults/period=1/ -o "$WORK/perf.data" \
      -- sleep "$SECS" 2>/dev/null
    after=$(wc -l < "$WORK/out")
    kill "${pids[@]}"
    wait "${pids[@]}" 2>/dev/null || true
    # Each sample counts for its process, named by its main thread (a replica's is its binary,
    # bin-NAME; a run's and its starter's `cronlock`), or by its own name when the process's
    # main thread was never sampled.
    perf script -i "$WORK/perf.data" -F pid,tid,comm,event 2>/dev/null | awk -v n=$((after - before)) \
      -v round="$round" -v name="$name" '
      { c = $1; for (i = 2; i < NF - 1; i++) c = c " " $i
        split($(NF - 1), ids, "/"); pid[NR] = ids[1]; comm[NR] = c; ev[NR] = $NF
        if (ids[1] == ids[2]) main[ids[1]] = c }
      END {
        for (i = 1; i <= NR; i++) {
          c = (pid[i] in main) ? main[pid[i]] : comm[i]
          if (c ~ /^(sh|date)$/) g = "cmd"; else if (c == "cronlock") g = "run"
          else if (c ~ /^cronlock-guard/) g = "guard"; else if (c ~ /^bin-/) g = "replica"
          else if (c ~ /^redis/) g = "redis"; else g = "rest"
          if (ev[i] ~ /cpu-clock/) cpu[g]++; else flt[g]++ }
        own = cpu["run"] + cpu["guard"] + cpu["replica"] + cpu["redis"]
        printf "| %d | %s | %d | %s | %s | %s | %s | %s | **%.2fx** |\n", round, name, n, cell("cmd"),
          cell("run"), cell("guard"), cell("replica"), cell("redis"), own / cpu["cmd"] }
      function cell(g) { return sprintf("%.3f ms, %d faults", cpu[g] / 2000 * 1000 / n, flt[g] / n) }'
  done
done
