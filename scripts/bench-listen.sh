#!/usr/bin/env bash
# What `--listen` costs the scheduler under a hostile load, as a Markdown report: 5 jobs every
# second on 3 replicas (one of them with --listen), the start delay of each instant's command
# with and without a flood on that replica's port: 200 clients that each send one byte a second
# (again when dropped) and 2,000 requests a second (GET /healthz, every 50th /metrics) from 4
# other threads. Rounds interleaved (each runs both variants, in random order); per round the
# p99 of the delays; medians and spreads; the flooded replica's largest RSS.
# Usage: scripts/bench-listen.sh [ROUNDS] [SECS] (default 6 rounds of 20 s).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-6}
SECS=${2:-20}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis
{
  echo "CRON_TZ=UTC"
  for j in 1 2 3 4 5; do echo "* * * * * * l$j echo \$CRONLOCK_INSTANT \$(date +%s.%N) >> $WORK/runs"; done
} > "$WORK/crontab"
cat > "$WORK/flood.py" <<'PY'
import socket, sys, threading, time
port, secs = int(sys.argv[1]), float(sys.argv[2])
end = time.time() + secs
served = [0]
def slow():
    def open_():
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            return None
    socks = [open_() for _ in range(200)]
    while time.time() < end:
        for i, s in enumerate(socks):
            try:
                s.send(b"G")
            except (OSError, AttributeError):
                socks[i] = open_()
        time.sleep(1)
def fast():
    n, t0 = 0, time.time()
    while time.time() < end:
        n += 1
        wait = t0 + n / 500 - time.time()
        if wait > 0:
            time.sleep(wait)
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" if n % 50 == 0 else b"GET /healthz HTTP/1.1\r\n\r\n")
            if s.recv(12).startswith(b"HTTP/1.1 200"):
                served[0] += 1
            s.close()
        except OSError:
            pass
ts = [threading.Thread(target=slow)] + [threading.Thread(target=fast) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print(served[0] / secs)
PY
p99() { # FILE: "P99 P50 RUNS"
  local runs p50 p90 p99 max
  read -r runs p50 p90 p99 max < <(bench_delays "$1")
  echo "$p99 $p50 $runs"
}
LPORT=$(free_port)
: > "$WORK/rounds"
for round in $(seq "$ROUNDS"); do
  for variant in $(printf 'quiet\nflood\n' | shuf); do
    : > "$WORK/runs"
    pids=()
    "$BIN" --crontab "$WORK/crontab" --listen "127.0.0.1:$LPORT" 2>/dev/null & pids+=($!)
    for _ in 1 2; do "$BIN" --crontab "$WORK/crontab" 2>/dev/null & pids+=($!); done
    sleep 2
    rate=0 rss=0
    if [ "$variant" = flood ]; then
      python3 "$WORK/flood.py" "$LPORT" "$SECS" > "$WORK/rate" &
      fl=$!
    fi
    for _ in $(seq "$((SECS * 5))"); do
      r=$(awk '/VmRSS/ {print $2}' "/proc/${pids[0]}/status")
      [ "$r" -gt "$rss" ] && rss=$r
      sleep 0.2
    done
    if [ "$variant" = flood ]; then wait "$fl"; rate=$(cat "$WORK/rate"); fi
    kill -TERM "${pids[@]}"; wait "${pids[@]}" || true
    # The first and last 2 s met replicas starting or stopping.
    sort "$WORK/runs" | awk 'NR > 10' | head -n -10 > "$WORK/mid"
    echo "$variant $(p99 "$WORK/mid") $rate $rss" >> "$WORK/rounds"
  done
done
python3 - "$WORK/rounds" "$ROUNDS" "$SECS" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
by = {"quiet": [], "flood": []}
for v, p99, p50, n, rate, rss in rows:
    by[v].append((float(p99), float(p50), int(n), float(rate), int(rss)))
print("## cronlock --listen under a flood")
print()
print(f"{sys.argv[2]} interleaved rounds of {sys.argv[3]} s, 5 jobs every second on 3 replicas; "
      "the flood hits the one with --listen.")
print()
print("| variant | start delay p99 (ms), median (min, max) | p50 (ms) | requests answered a second | largest RSS (KiB) |")
print("|---|---|---|---|---|")
for v in ("quiet", "flood"):
    r = by[v]
    p = [x[0] for x in r]
    print(f"| {v} | **{statistics.median(p):.1f}** ({min(p):.1f}, {max(p):.1f}) | "
          f"{statistics.median(x[1] for x in r):.1f} | {statistics.median(x[3] for x in r):.0f} | "
          f"{max(x[4] for x in r)} |")
d = [f[0] - q[0] for f, q in zip(by["flood"], by["quiet"])]
print()
print(f"p99 growth, round by round (flood - quiet): median **{statistics.median(d):+.1f} ms** "
      f"(min {min(d):+.1f}, max {max(d):+.1f}).")
PY
