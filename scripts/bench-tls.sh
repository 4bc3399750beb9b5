#!/usr/bin/env bash
# The cost of TLS per run: `cronlock k -- true` over rediss:// against redis://, both on loopback,
# measured interleaved (scripts/interleave.c: each round runs every command once in a random
# order; medians over ROUNDS rounds, three repeats), with ratios to `flock -n FILE true`.
# Installs redis-server, openssl and gcc when missing; certificates are made in a temp dir.
# Usage: scripts/bench-tls.sh [rounds]   (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-300}
. scripts/bench-common.sh
bench_install redis-server:redis-server openssl:openssl gcc:gcc
bench_setup
cd "$WORK"
ec="-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
openssl req -x509 $ec -keyout ca.key -out ca.crt -days 2 -subj /CN=bench-ca 2>/dev/null
openssl req $ec -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" > san.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 \
  -extfile san.ext 2>/dev/null
P=$(free_port); T=$(free_port)
redis-server --port "$P" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$WORK/plain.pid" \
  --dir "$WORK" >/dev/null
redis-server --port 0 --tls-port "$T" --bind 127.0.0.1 --tls-cert-file server.crt \
  --tls-key-file server.key --tls-ca-cert-file ca.crt --tls-auth-clients no --save '' \
  --daemonize yes --pidfile "$WORK/tls.pid" --dir "$WORK" >/dev/null
for _ in $(seq 100); do
  "$BIN" -u "redis://127.0.0.1:$P" up true 2>/dev/null && \
    "$BIN" -u "rediss://127.0.0.1:$T" --tls-ca-cert ca.crt up true 2>/dev/null && break
  sleep 0.05
done
cat > cmds <<CMDS
flock -n $WORK/flock.lock true
$BIN -u redis://127.0.0.1:$P bench -- true
$BIN -u rediss://127.0.0.1:$T --tls-ca-cert $WORK/ca.crt bench -- true
true
CMDS
echo "$(nproc) cores, $(uname -r), $(redis-server --version | cut -d' ' -f3), $ROUNDS rounds x 3"
echo
echo "| repeat | flock | cronlock redis:// | cronlock rediss:// | true | plain / flock | TLS / flock | TLS - plain |"
echo "|---|---|---|---|---|---|---|---|"
for rep in 1 2 3; do
  bench_repeat "$ROUNDS" bench-tls
  awk -v r="$rep" -v f="${m[0]}" -v p="${m[1]}" -v t="${m[2]}" -v tr="${m[3]}" 'BEGIN {
    printf "| %d | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2fx | %.2fx | +%.2f ms |\n",
      r, f, p, t, tr, p / f, t / f, t - p }'
done
echo
echo "Medians per repeat; p10-p90 of the last repeat:"
awk '{c=$5; for (i = 6; i <= NF; i++) c = c " " $i; printf "- `%s`: p10 %.2f ms, p90 %.2f ms\n", c, $2, $3}' out |
  sed "s|$WORK|\$TMP|g; s|$BIN|cronlock|g"
