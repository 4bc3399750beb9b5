#!/usr/bin/env bash
# A plain run's cost, this build against others, interleaved: each repeat copies every binary
# afresh (how its pages sit in the page cache moves the ratio more than most changes:
# docs/benchmarks.md), then times `cronlock bench-N -- true` and `cronlock bench-N -- echo hi`
# of each beside `flock -n FILE true` (scripts/interleave.c: every round runs each once in a
# random order). Prints each median, p10-p90 and its ratio to flock's median.
# Usage: scripts/bench-plain.sh [ROUNDS] [REPEATS] [OTHER_BIN...]   (default 400 rounds, 3 repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-400}
REPEATS=${2:-3}
shift $(($# < 2 ? $# : 2))
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc flock:util-linux
bench_setup
bench_redis
export CRONLOCK_CONFLICT_EXIT_CODE=99
bench_builds "$@"
echo "| repeat | command | median | p10-p90 | / flock |"
echo "|---|---|---|---|---|"
for rep in $(seq "$REPEATS"); do
  echo "flock -n $WORK/flock.lock true" > "$WORK/cmds"
  for b in "${builds[@]}"; do
    cp "${b#*=}" "$WORK/bin-${b%%=*}"
    printf '%s\n' "$WORK/bin-${b%%=*} bench-{n} -- true" "$WORK/bin-${b%%=*} bench-{n} -- echo hi" \
      >> "$WORK/cmds"
  done
  bench_repeat "$ROUNDS" "repeat $rep"
  awk -v r="$rep" -v w="$WORK/" 'NR == 1 {f = $1}
    {line = ""; for (i = 5; i <= NF; i++) line = line (i > 5 ? " " : "") $i; sub(w, "", line)
     printf "| %d | `%s` | %.2f ms | %.2f-%.2f | **%.2fx** |\n", r, line, $1, $2, $3, $1 / f}' \
    "$WORK/out"
done
