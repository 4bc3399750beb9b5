#!/usr/bin/env bash
# What a run costs the whole machine, as a Markdown report: RATE jobs due every second (default
# 200), served by 3 replicas of each variant against one loopback redis-server (flushed between
# runs), each job's command `echo $INSTANT $(date +%s.%N) >> FILE`. Interleaved: each round runs
# every variant once, in random order; each run measures SECS seconds (default 10) of steady
# service from 3 s after the start:
#   - machine CPU per run: busy time from /proc/stat (everything: replicas, runs, commands,
#     Redis, the kernel) over the runs started in the window;
#   - start delay p50/p99 (from the instant to the command's start).
# Variants: "floor" (the command alone, posix_spawn'ed RATE times a second by a small C loop: no
# scheduler), "this" (this build), each OTHER_BIN given, and with BULLMQ=1 "bullmq" (BullMQ's job
# schedulers, `every: 1000`, 3 Node workers spawning the same command; installed with npm in a
# temporary directory, never by the test suite).
# Usage: scripts/bench-machine.sh [ROUNDS] [OTHER_BIN...] (default 5 rounds); RATE, SECS.
# Installs redis-server, redis-tools and gcc when missing (and with BULLMQ=1, nodejs and npm).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
shift || true
OTHERS=("$@")
RATE=${RATE:-200}
SECS=${SECS:-10}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
[ "${BULLMQ:-0}" = 1 ] && bench_install node:nodejs npm:npm
bench_setup
bench_redis

# The floor: the command alone, RATE times a second.
cat > "$WORK/floor.c" <<'C'
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <signal.h>
extern char **environ;
static volatile sig_atomic_t done;
static void stop(int s) { (void)s; done = 1; }
int main(int argc, char **argv) {
  int rate = atoi(argv[1]);
  char *cmd = argv[2];
  signal(SIGTERM, stop);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec++; t.tv_nsec = 0;
  while (!done) {
    clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &t, 0);
    char inst[64];
    struct tm tm;
    gmtime_r(&t.tv_sec, &tm);
    strftime(inst, sizeof inst, "INSTANT=%Y-%m-%dT%H:%M:%SZ", &tm);
    putenv(inst);
    for (int i = 0; i < rate && !done; i++) {
      pid_t p;
      char *a[] = {"sh", "-c", cmd, 0};
      posix_spawn(&p, "/bin/sh", 0, 0, a, environ);
      while (waitpid(-1, 0, WNOHANG) > 0) {}
    }
    t.tv_sec++;
  }
  while (wait(0) > 0) {}
  return 0;
}
C
gcc -O2 -o "$WORK/floor" "$WORK/floor.c"

if [ "${BULLMQ:-0}" = 1 ]; then
  (cd "$WORK" && npm init -y >/dev/null && npm install --silent bullmq ioredis >/dev/null)
  cat > "$WORK/bull-schedule.js" <<'JS'
// RATE job schedulers, every second, on a fresh queue.
const { Queue } = require("bullmq");
const [port, rate] = [Number(process.argv[2]), Number(process.argv[3])];
(async () => {
  const q = new Queue("bench", { connection: { host: "127.0.0.1", port } });
  for (let i = 0; i < rate; i++) await q.upsertJobScheduler(`j${i}`, { every: 1000 }, { name: "j" });
  await q.close();
})();
JS
  cat > "$WORK/bull-worker.js" <<'JS'
// One worker: each job runs the command with its instant (when it was due) in INSTANT.
const { Worker } = require("bullmq");
const { spawn } = require("child_process");
const [port, cmd] = [Number(process.argv[2]), process.argv[3]];
const w = new Worker("bench", (job) => new Promise((resolve) => {
  // A scheduler's job id ends in the time it is due ("repeat:ID:MILLIS").
  const due = new Date(Number(job.id.split(":").pop())).toISOString();
  const c = spawn("/bin/sh", ["-c", cmd], { env: { ...process.env, INSTANT: due }, stdio: "ignore" });
  c.on("exit", resolve);
}), { connection: { host: "127.0.0.1", port }, concurrency: 100 });
process.on("SIGTERM", async () => { await w.close(); process.exit(0); });
JS
fi

# Start VARIANT (its pids in $WORK/pids), writing runs to FILE.
start_variant() {
  local v=$1 file=$2 bin
  local cmd="echo \$INSTANT \$(date +%s.%N) >> $file"
  : > "$WORK/pids"
  case $v in
    floor)
      "$WORK/floor" "$RATE" "$cmd" & echo $! >> "$WORK/pids" ;;
    bullmq)
      node "$WORK/bull-schedule.js" "$P" "$RATE"
      for _ in 1 2 3; do node "$WORK/bull-worker.js" "$P" "$cmd" & echo $! >> "$WORK/pids"; done ;;
    *)
      bin=$BIN; [ "$v" = this ] || bin=${OTHERS[${v#other}]}
      { echo "CRON_TZ=UTC"; for j in $(seq "$RATE"); do
          echo "* * * * * * m$j INSTANT=\$CRONLOCK_INSTANT; $cmd"; done; } > "$WORK/crontab"
      for _ in 1 2 3; do
        "$bin" --crontab "$WORK/crontab" --max-jobs "$RATE" >/dev/null 2>>"$WORK/replicas.err" &
        echo $! >> "$WORK/pids"
      done ;;
  esac
}
stop_variant() {
  while read -r p; do kill -TERM "$p" 2>/dev/null || true; done < "$WORK/pids"
  while read -r p; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done < "$WORK/pids"
}
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }

# One run of VARIANT: "CPU_MS_PER_RUN P50 P99".
measure() {
  local v=$1 runs="$WORK/runs"
  R flushall >/dev/null
  : > "$runs"
  start_variant "$v" "$runs"
  sleep 3
  local n0 n1 b0 b1 hz
  hz=$(getconf CLK_TCK)
  n0=$(wc -l < "$runs"); b0=$(busy)
  sleep "$SECS"
  n1=$(wc -l < "$runs"); b1=$(busy)
  stop_variant
  sed -n "$((n0 + 1)),${n1}p" "$runs" > "$WORK/window"
  read -r _ p50 _ p99 _ < <(bench_delays "$WORK/window")
  awk -v b=$((b1 - b0)) -v n=$((n1 - n0)) -v hz="$hz" -v p50="$p50" -v p99="$p99" \
    'BEGIN {printf "%.3f %.0f %.0f\n", b * 1000 / hz / n, p50, p99}'
}

variants=(floor this)
for i in "${!OTHERS[@]}"; do variants+=("other$i"); done
[ "${BULLMQ:-0}" = 1 ] && variants+=(bullmq)
for v in "${variants[@]}"; do : > "$WORK/res.$v"; done
for r in $(seq "$ROUNDS"); do
  for v in $(printf '%s\n' "${variants[@]}" | shuf); do
    measure "$v" >> "$WORK/res.$v"
  done
  echo "round $r of $ROUNDS done" >&2
done

echo "## Machine CPU per run, $RATE jobs every second, 3 replicas"
echo
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), cronlock $("$BIN" --version | cut -d' ' -f2), $(date -u +%F); $ROUNDS interleaved rounds of $SECS s"
echo
echo "| variant | machine CPU per run, median (range) | above the floor | start delay p50 / p99, medians |"
echo "|---|---|---|---|"
floor=$(sort -n "$WORK/res.floor" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
for v in "${variants[@]}"; do
  name=$v; case $v in other*) name=${OTHERS[${v#other}]} ;; esac
  sort -n -k1 "$WORK/res.$v" | awk -v name="$name" -v floor="$floor" '
    {c[NR]=$1} END {m=c[int((NR+1)/2)]; printf "| %s | %.2f ms (%.2f-%.2f) | %.2f ms |", name, m, c[1], c[NR], m - floor}'
  sort -n -k2 "$WORK/res.$v" | awk '{p[NR]=$2} END {printf " %s /", p[int((NR+1)/2)]}'
  sort -n -k3 "$WORK/res.$v" | awk '{p[NR]=$3} END {printf " %s ms |\n", p[int((NR+1)/2)]}'
done
