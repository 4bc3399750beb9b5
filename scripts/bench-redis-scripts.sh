#!/usr/bin/env bash
# Where a fleet's Redis CPU goes: REPLICAS replicas (default 3) of this build serving 20 jobs
# every second on one loopback redis-server, measured over 8 s of steady service (from 3 s after
# the replicas started):
#   - Redis CPU per run (INFO cpu deltas), and the same server's CPU over 8 s with no client at
#     all (its own timers), as a share of it;
#   - then over 4 s more (SLOWLOG logging every command costs Redis CPU of its own, so in a
#     window of its own), each script's calls per run and execution time per call (execution
#     only, no I/O; wall time, so a busy machine lengthens it), the scripts named by their keys.
# Usage: scripts/bench-redis-scripts.sh [REPLICAS] [REPEATS]   (default 3 replicas, 3 repeats)
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
REPEATS=${2:-3}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis
idle0=$(cpu); sleep 8; idle1=$(cpu)
echo "| repeat | Redis CPU per run | of it, Redis idle | script | calls per run | median | mean | time per run |"
echo "|---|---|---|---|---|---|---|---|"
for rep in $(seq "$REPEATS"); do
  R flushall >/dev/null
  runs="$WORK/runs"; : > "$runs"
  { echo "CRON_TZ=UTC"
    for j in $(seq 20); do echo "* * * * * * s-$j echo \$CRONLOCK_INSTANT >> $runs"; done
  } > "$WORK/crontab"
  pids=()
  for i in $(seq "$N"); do
    "$BIN" --crontab "$WORK/crontab" >/dev/null 2>"$WORK/r$i.err" & pids+=($!)
  done
  sleep 3
  before=$(wc -l < "$runs"); c0=$(cpu)
  sleep 8
  c1=$(cpu); after=$(wc -l < "$runs")
  R config set slowlog-max-len 1000000 >/dev/null
  R slowlog reset >/dev/null
  R config set slowlog-log-slower-than 0 >/dev/null
  logged0=$(wc -l < "$runs")
  sleep 4
  R config set slowlog-log-slower-than -1 >/dev/null
  logged1=$(wc -l < "$runs")
  redis-cli -p "$P" --json slowlog get 1000000 > "$WORK/slow.json"
  kill -TERM "${pids[@]}"; wait "${pids[@]}" || true
  python3 - "$rep" "$c0" "$c1" "$idle0" "$idle1" "$((after - before))" "$((logged1 - logged0))" \
    "$WORK/slow.json" <<'PY'
import json, sys
rep, c0, c1, i0, i1 = sys.argv[1], *map(float, sys.argv[2:6])
measured, runs, path = max(int(sys.argv[6]), 1), max(int(sys.argv[7]), 1), sys.argv[8]
per_run = (c1 - c0) * 1000 / measured
idle = (i1 - i0) * 1000 / measured
def name(args):
    if args[0].upper() not in ("EVALSHA", "EVAL"):
        return None
    keys = args[3:3 + int(args[2])]
    first = keys[0].split("}", 1)[-1] if keys else ""
    return {(10, ""): "acquire", (6, ""): "release", (2, ":members"): "heartbeat (members)"}.get(
        (len(keys), first), "claimed" if first == ":schedule" else f"{len(keys)} keys, {first or 'lock'}")
calls = {}
for entry in json.load(open(path)):
    n = name(entry[3])
    if n:
        calls.setdefault(n, []).append(entry[2])
first = True
for n, us in sorted(calls.items(), key=lambda kv: -sum(kv[1])):
    us.sort()
    head = f"| {rep} | {per_run:.3f} ms | {idle:.3f} ms |" if first else "| | | |"
    first = False
    print(f"{head} {n} | {len(us) / runs:.2f} | {us[len(us) // 2]} us | {sum(us) / len(us):.0f} us | "
          f"{sum(us) / runs / 1000:.3f} ms |")
PY
done
