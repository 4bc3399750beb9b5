#!/usr/bin/env bash
# What one wake of Redis costs it on this machine: the CPU a lone PING costs a loopback
# redis-server (INFO cpu deltas, its idle housekeeping over the same time measured first and
# subtracted) when sent back to back and 2, 10, 50 and 250 ms after the last one, on one
# connection. Interleaved: each round measures every gap once, in random order; medians over the
# rounds. This is the floor under `bench-crontab.sh`'s Redis CPU per run: a fleet's claims,
# releases and heartbeats each wake Redis after such a gap (docs/benchmarks.md).
# Usage: scripts/bench-redis-wake.sh [ROUNDS] (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools
WORK=$(mktemp -d)
trap 'for p in "$WORK"/*.pid; do kill "$(cat "$p")" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
bench_redis
python3 - "$P" "$ROUNDS" <<'PY'
import random, socket, statistics, sys, time

port, rounds = int(sys.argv[1]), int(sys.argv[2])
sock = socket.create_connection(("127.0.0.1", port))
sock.settimeout(5)
buf = b""

def call(*args):
    global buf
    sock.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    while b"\r\n" not in buf:
        buf += sock.recv(65536)
    head, buf = buf.split(b"\r\n", 1)
    if head[:1] != b"$":
        return head
    n = int(head[1:])
    while len(buf) < n + 2:
        buf += sock.recv(65536)
    body, buf = buf[:n], buf[n + 2:]
    return body

def cpu():
    info = call(b"INFO", b"cpu").decode()
    return sum(float(l.split(":")[1]) for l in info.splitlines()
               if l.startswith(("used_cpu_sys:", "used_cpu_user:")))

gaps = [0.0, 0.002, 0.01, 0.05, 0.25]
got = {g: [] for g in gaps}
for _ in range(rounds):
    for gap in random.sample(gaps, len(gaps)):
        c0 = cpu(); time.sleep(1.0); idle = cpu() - c0
        n = 40 if gap >= 0.05 else 200
        c0, t0 = cpu(), time.monotonic()
        for _ in range(n):
            if gap:
                time.sleep(gap)
            call(b"PING")
        spent = cpu() - c0 - idle * (time.monotonic() - t0)
        got[gap].append(spent / n * 1e6)
print("| gap before the PING | Redis CPU per PING, median (min, max) |")
print("|---|---|")
for g in gaps:
    v = got[g]
    print(f"| {g * 1000:.0f} ms | {statistics.median(v):.1f} µs ({min(v):.1f}, {max(v):.1f}) |")
PY
