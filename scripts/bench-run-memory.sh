#!/usr/bin/env bash
# What a replica's running jobs cost in processes and memory, interleaved between builds:
#   scripts/bench-run-memory.sh [JOBS] [ROUNDS] [OTHER_BIN...]
# Each round starts, for every build in random order, one replica serving JOBS jobs (default
# 50) whose command is `sleep 6011`, waits until every command runs, and reads every process of
# the replica's tree: how many are cronlock's (the replica, its starter, and per job whatever
# cronlock keeps beside the command: a run, a guard), and their PSS (/proc/PID/smaps_rollup),
# above the same replica measured idle first (its jobs loaded, none due). Prints per build and
# round: cronlock processes, processes per job beyond the replica and its starter, PSS of
# cronlock's processes above idle (MiB), and per job (KiB).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-common.sh
JOBS=${1:-50}
ROUNDS=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
bench_install redis-server:redis-server python3:python3
bench_setup
bench_builds "$@"
bench_redis

# Sum of Pss (KiB) and count of cronlock's processes in the tree under $1 (commands excluded).
tree_cost() {
  python3 - "$1" <<'PY'
import os, sys
root = int(sys.argv[1])
kids = {}
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        stat = open(f"/proc/{p}/stat").read()
    except OSError:
        continue
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    kids.setdefault(ppid, []).append(int(p))
todo, pss, count = [root], 0, 0
while todo:
    p = todo.pop()
    todo += kids.get(p, [])
    try:
        comm = open(f"/proc/{p}/comm").read().strip()
        if not comm.startswith("cronlock"):
            continue
        for line in open(f"/proc/{p}/smaps_rollup"):
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
        count += 1
    except OSError:
        pass
print(pss, count)
PY
}

# Start a replica of $1 on crontab $2 (its pid in RP).
replica() {
  "$1" --crontab "$2" --max-jobs "$JOBS" > /dev/null 2> "$WORK/replica.err" &
  RP=$!
}

idle=$WORK/idle.tab busy=$WORK/busy.tab
: > "$idle"; : > "$busy"
for i in $(seq "$JOBS"); do
  echo "0 0 1 1 * mem-$i sleep 6011" >> "$idle"
  echo "* * * * * * --ttl 30s mem-$i sleep 6011" >> "$busy"
done

echo "build round cronlock_processes per_job pss_above_idle_MiB per_job_KiB"
for round in $(seq "$ROUNDS"); do
  for b in $(printf '%s\n' "${builds[@]}" | shuf); do
    name=${b%%=*} bin=${b#*=}
    R flushall > /dev/null
    replica "$bin" "$idle"
    sleep 2
    read -r idle_pss _ < <(tree_cost "$RP")
    kill -TERM "$RP"; wait "$RP" 2>/dev/null || true
    R flushall > /dev/null
    replica "$bin" "$busy"
    for _ in $(seq 300); do
      [ "$(pgrep -c -f '^sleep 6011$' || true)" -ge "$JOBS" ] && break
      sleep 0.1
    done
    sleep 1
    read -r pss count < <(tree_cost "$RP")
    # Drained: its runs end as their commands do.
    kill -TERM "$RP"; pkill -f '^sleep 6011$' || true
    wait "$RP" 2>/dev/null || true
    awk -v n="$name" -v r="$round" -v c="$count" -v j="$JOBS" -v p="$pss" -v i="$idle_pss" \
      'BEGIN { printf "%s %d %d %.2f %.2f %.1f\n", n, r, c, (c-2)/j, (p-i)/1024, (p-i)/j }'
  done
done
