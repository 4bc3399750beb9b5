#!/usr/bin/env bash
# The cost of --catch-up: a firing that runs its instant and a firing with nothing due, against
# today's --schedule run (no --catch-up), and the plain run `cronlock k -- true`, all on one
# loopback redis-server, measured interleaved (scripts/interleave.c: each round runs every command
# once in a random order; medians over ROUNDS rounds, three repeats), with ratios to
# `flock -n FILE true`. A firing that runs gets a fresh KEY each round ("{n}"), so its instant is
# always due; a firing with nothing due fires a KEY whose instant already ran.
# BASE_BIN=path/to/an/older/cronlock adds that build's plain run, to show the plain run unchanged.
# Installs redis-server and gcc when missing.
# Usage: scripts/bench-catchup.sh [rounds]   (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-300}
. scripts/bench-common.sh
bench_install redis-server:redis-server gcc:gcc
bench_setup
cd "$WORK"
P=$(free_port)
redis-server --port "$P" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$WORK/redis.pid" \
  --dir "$WORK" >/dev/null
U=redis://127.0.0.1:$P
for _ in $(seq 100); do "$BIN" -u "$U" up true 2>/dev/null && break; sleep 0.05; done
# A schedule whose instants are fixed: midnight UTC on the first of the month. Its words hold
# spaces, so the scheduled lines separate words with tabs (scripts/interleave.c).
S="CRON_TZ=UTC 0 0 0 1 * *"
# The KEYs with nothing due: their instant ran once, here.
"$BIN" -u "$U" --schedule "$S" --catch-up 100d done-c -- true
"$BIN" -u "$U" --schedule "$S" done-s -- true
t=$'\t'
{
  echo "flock -n $WORK/flock.lock true"
  echo "$BIN -u $U plain -- true"
  echo "$BIN$t-u$t$U$t--schedule$t$S${t}run-s-{n}$t--${t}true"
  echo "$BIN$t-u$t$U$t--schedule$t$S$t--catch-up${t}100d${t}run-c-{n}$t--${t}true"
  echo "$BIN$t-u$t$U$t--schedule$t$S${t}done-s$t--${t}true"
  echo "$BIN$t-u$t$U$t--schedule$t$S$t--catch-up${t}100d${t}done-c$t--${t}true"
  if [ -n "${BASE_BIN:-}" ]; then echo "$BASE_BIN -u $U plain-base -- true"; fi
} > cmds
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), $ROUNDS rounds x 3"
echo
echo "| repeat | flock | plain | --schedule runs | --catch-up runs | --schedule skips | --catch-up nothing due | catch-up run / schedule run | nothing due / schedule run | plain / flock |${BASE_BIN:+ base plain / flock |}"
echo "|---|---|---|---|---|---|---|---|---|---|${BASE_BIN:+---|}"
for rep in 1 2 3; do
  bench_repeat "$ROUNDS" bench-catchup
  awk -v r="$rep" -v f="${m[0]}" -v p="${m[1]}" -v sr="${m[2]}" -v cr="${m[3]}" -v ss="${m[4]}" \
      -v cn="${m[5]}" -v b="${m[6]:-0}" 'BEGIN {
    printf "| %d | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2fx | %.2fx | %.2fx |",
      r, f, p, sr, cr, ss, cn, cr / sr, cn / sr, p / f
    if (b > 0) printf " %.2fx |", b / f
    printf "\n" }'
done
echo
echo "p10-p90 of the last repeat:"
awk '{c=$5; for (i = 6; i <= NF; i++) c = c " " $i; printf "- `%s`: median %.2f ms, p10 %.2f ms, p90 %.2f ms\n", c, $1, $2, $3}' out |
  sed "s|$WORK|\$TMP|g; s|$BIN|cronlock|g; s|redis://127.0.0.1:$P|URL|g"
