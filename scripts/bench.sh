#!/usr/bin/env bash
# Benchmark cronlock on this machine against a loopback redis-server it starts on a free port.
# Prints a Markdown report: overhead vs flock and true (interleaved), peak RSS, Redis
# commands per run and renewals per TTL, --wait handoff latency with 20 waiters, and contention
# (50 cronlocks at once). Installs gcc, redis-server and GNU time when missing.
# Usage: scripts/bench.sh [rounds]   (default 300 interleaved rounds, three repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-300}

need=()
command -v gcc >/dev/null || need+=(gcc)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
[ -x /usr/bin/time ] || need+=(time)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --release --locked --quiet
BIN=$PWD/target/x86_64-unknown-linux-gnu/release/cronlock
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$WORK/redis.pid" --dir "$WORK" >/dev/null
trap 'kill "$(cat "$WORK/redis.pid")" 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
export CRONLOCK_REDIS_URL="redis://127.0.0.1:$PORT"
R() { redis-cli -p "$PORT" "$@"; }

echo "## cronlock benchmark"
echo
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), cronlock $($BIN --version | cut -d' ' -f2), $(date -u +%F)"
echo

# 1. Overhead, interleaved: each round runs flock, cronlock and true once in a random order
#    (scripts/interleave.c: fork/exec/wait timed on CLOCK_MONOTONIC), so this noisy machine's
#    drift hits every command alike. CRONLOCK_CONFLICT_EXIT_CODE=99 (-E 99 as a variable, so the
#    command line is the plain `cronlock KEY -- COMMAND`): a run that did not take the lock fails.
gcc -O2 -o "$WORK/interleave" scripts/interleave.c
cat > "$WORK/cmds" <<CMDS
flock -n $WORK/flock.lock true
$BIN bench -- true
true
CMDS
echo "### Overhead per run (interleaved, $ROUNDS rounds x 3, medians)"
echo
echo "| repeat | flock | cronlock | true | cronlock / flock | cronlock p10–p90 |"
echo "|---|---|---|---|---|---|"
for rep in 1 2 3; do
  CRONLOCK_CONFLICT_EXIT_CODE=99 "$WORK/interleave" "$ROUNDS" "$WORK/cmds" > "$WORK/out"
  fails=$(awk '{s+=$4} END {print s}' "$WORK/out")
  [ "$fails" -eq 0 ] || { echo "bench: $fails runs failed or did not take the lock" >&2; exit 1; }
  mapfile -t m < <(awk '{print $1, $2, $3}' "$WORK/out")
  read -r f _ _ <<<"${m[0]}"; read -r c c10 c90 <<<"${m[1]}"; read -r t _ _ <<<"${m[2]}"
  awk -v r="$rep" -v f="$f" -v c="$c" -v t="$t" -v a="$c10" -v b="$c90" 'BEGIN {
    printf "| %d | %.2f ms | %.2f ms | %.2f ms | **%.2fx** | %.2f–%.2f ms |\n", r, f, c, t, c / f, a, b }'
done
echo

# 2. Peak RSS while holding a lock.
rss() { /usr/bin/time -v "$@" 2>&1 >/dev/null | awk '/Maximum resident/ {print $6}'; }
CL_RSS=$(rss "$BIN" rss -- sleep 1)
FL_RSS=$(rss flock -n "$WORK/flock.lock" sleep 1)
echo "### Memory"
echo
echo "Peak RSS while holding a lock (\`/usr/bin/time -v cronlock rss -- sleep 1\`): **$((CL_RSS)) KiB**"
echo "(flock: $FL_RSS KiB). The guard process adds its own RSS, mostly pages shared with cronlock."
echo

# 3. Redis commands per run, renewals per TTL. MONITOR lists client commands as
#    "[db 127.0.0.1:port]" and the commands scripts run inside Redis as "[db lua]".
monitor() { # monitor FILE CMD...: record what Redis sees while CMD runs
  local out=$1; shift
  redis-cli -p "$PORT" monitor >"$out" & local mon=$!
  for _ in $(seq 100); do [ -s "$out" ] && break; sleep 0.01; done
  "$@"
  sleep 0.2; kill "$mon"; wait "$mon" 2>/dev/null || true
}
hundred() { for _ in $(seq 100); do "$BIN" cmds -- true; done; }
monitor "$WORK/m1" hundred
client=$(grep -cE '^[0-9.]+ \[[0-9]+ [0-9.]+:[0-9]+\]' "$WORK/m1" || true)
inside=$(grep -c ' lua\] ' "$WORK/m1" || true)
echo "### Redis commands"
echo
echo "Per run of \`cronlock k -- true\`: **$(python3 -c "print($client/100)") client commands** (one"
echo "\`EVALSHA\` to acquire, one to release: two round trips on one connection), running"
echo "$(python3 -c "print($inside/100)") commands inside Redis (the scripts' reads and writes, run history included)."
monitor "$WORK/m2" "$BIN" --ttl 3s renew -- sleep 9
evals=$(grep -E '^[0-9.]+ \[[0-9]+ [0-9.]+:[0-9]+\] "EVALSHA"' "$WORK/m2" | wc -l)
echo "A 9 s job with \`--ttl 3s\`: $evals client \`EVALSHA\` in all, so $((evals - 2)) renewals,"
echo "**$(python3 -c "print(round(($evals-2)/3, 1))") per TTL** (TTL/3, shortened so that three renewals fit between a confirmed renewal"
echo "and the moment a feared loss would send SIGTERM: every 0.72 s here, with the default grace of TTL/4)."
echo

# 4 and 5: handoff latency and contention.
python3 - "$BIN" "$WORK" <<'EOF'
import os, statistics, subprocess, sys, time
bin, work = sys.argv[1], sys.argv[2]
log = os.path.join(work, "handoff.log")
# Each waiter's command appends its start and end time ($EPOCHREALTIME, no fork) and holds 20 ms.
body = f'echo "s $EPOCHREALTIME" >> {log}; sleep 0.02; echo "e $EPOCHREALTIME" >> {log}'
procs = [subprocess.Popen([bin, "-w", "30s", "handoff", "--", "bash", "-c", body]) for _ in range(20)]
codes = [p.wait() for p in procs]
ev = [l.split() for l in open(log)]
starts = [float(t) for k, t in ev if k == "s"]
ends = [float(t) for k, t in ev if k == "e"]
gaps = sorted((s - e) * 1000 for s, e in zip(starts[1:], ends[:-1]))
print("### Handoff under --wait (20 waiters, 20 ms critical section each)\n")
print(f"All exited 0: {all(c == 0 for c in codes)}; runs: {len(starts)}; ")
print(f"time from one command's last instruction to the next command's first (release, wake-up,")
print(f"acquire, spawn, bash start-up): **median {statistics.median(gaps):.2f} ms**, "
      f"p90 {gaps[int(len(gaps)*0.9)]:.2f} ms, max {gaps[-1]:.2f} ms.\n")

marker = os.path.join(work, "contention.log")
body = f"echo run >> {marker}; sleep 1"
t0 = []
procs = []
for _ in range(50):
    t0.append(time.monotonic())
    procs.append(subprocess.Popen([bin, "-E", "75", "contention", "-c", body]))
done = {}
while len(done) < 50:
    for i, p in enumerate(procs):
        if i not in done and p.poll() is not None:
            done[i] = (time.monotonic() - t0[i], p.returncode)
    time.sleep(0.0005)
runs = open(marker).read().count("run")
losers = sorted(d for d, c in done.values() if c == 75)
print("### Contention (50 cronlocks started at once for one KEY)\n")
print(f"Commands run: **{runs}**; skipped (exit 75): {len(losers)}; "
      f"each skipper's wall time from spawn to exit: median {statistics.median(losers)*1000:.1f} ms, "
      f"max **{losers[-1]*1000:.1f} ms**.\n")
EOF
