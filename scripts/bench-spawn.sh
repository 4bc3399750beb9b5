#!/usr/bin/env bash
# How a replica's helper could start its commands (scripts/spawn.c: posix_spawn, fork, a cgroup
# made per start, clone3 into a new or a pooled cgroup, a vfork-like clone3 into a pooled one),
# interleaved, from a process with no heap and with a 16 MiB one; each way's median wall time
# from the start to the reap, p10-p90, mean CPU per start, and both as ratios to posix_spawn's.
# Needs a writable cgroup v2 directory (the one this shell is in, or the unified hierarchy's
# root in a hybrid layout); the cgroups it makes are removed.
# Usage: scripts/bench-spawn.sh [ROUNDS] [REPEATS] [CMD]   (default 400 rounds, 3 repeats, true)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-400}
REPEATS=${2:-3}
CMD=${3:-true}
. scripts/bench-common.sh
bench_install gcc:gcc
WORK=$(mktemp -d)
# (A mountinfo line's file system type is the field after its lone "-".)
root=$(awk '{for (i = 7; i < NF; i++) if ($i == "-") {if ($(i + 1) == "cgroup2") {print $5; exit} break}}' \
  /proc/self/mountinfo)
[ -n "$root" ] || { echo "bench-spawn: no cgroup v2 hierarchy is mounted" >&2; exit 1; }
parent="$root$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)"
parent="${parent%/}/spawn-bench-$$"
mkdir "$parent"
trap 'rmdir "$parent"/* "$parent" 2>/dev/null || true; rm -rf "$WORK"' EXIT
gcc -O2 -o "$WORK/spawn" scripts/spawn.c
echo "| repeat | heap | way | median | p10-p90 | CPU/start | wall / floor | CPU / floor |"
echo "|---|---|---|---|---|---|---|---|"
for rep in $(seq "$REPEATS"); do
  for mib in 0 16; do
    "$WORK/spawn" "$ROUNDS" "$parent" "$CMD" "$mib" > "$WORK/out"
    awk -v r="$rep" -v h="$mib MiB" 'NR == 1 {f = $1; c = $4}
      {printf "| %d | %s | %s | %.3f ms | %.3f-%.3f | %.3f ms | **%.2fx** | %.2fx |\n",
       r, h, $5, $1, $2, $3, $4, $1 / f, $4 / c}' "$WORK/out"
  done
done
