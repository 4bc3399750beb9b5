# Sourced by the benchmark scripts (bench-tls, bench-catchup, bench-crontab, bench-listen,
# bench-plain, bench-redis-scripts, bench-redis-wake, bench-spawn, bench-fleet-profile, bench-run-memory): what every interleaved benchmark needs first. Not run on its own.

# Install the Debian packages of the commands that are missing: bench_install CMD:PACKAGE ...
bench_install() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    local sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

# Build the release binary (BIN) and the timer (WORK/interleave) in a temporary WORK directory,
# which is removed on exit, after killing every server whose WORK/*.pid file is there.
bench_setup() {
  echo "building the release binary and the timer..." >&2
  cargo build --release --locked --quiet
  BIN=$PWD/target/x86_64-unknown-linux-gnu/release/cronlock
  WORK=$(mktemp -d)
  trap 'for p in "$WORK"/*.pid; do kill "$(cat "$p")" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
  gcc -O2 -o "$WORK/interleave" scripts/interleave.c
}

# The builds an interleaved benchmark compares, in the array builds: this one (BIN, from
# bench_setup) as "this=BIN", then each OTHER_BIN given as "its file name=OTHER_BIN".
bench_builds() {
  builds=("this=$BIN")
  local other
  for other in "$@"; do builds+=("$(basename "$other")=$other"); done
}

# A free TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# One interleaved repeat of $WORK/cmds ($1 rounds): the medians in the array m (one per
# command, in file order), the full lines in $WORK/out; a failed run stops the benchmark ($2
# names it).
bench_repeat() {
  (cd "$WORK" && ./interleave "$1" cmds > out)
  mapfile -t m < <(awk '{print $1}' "$WORK/out")
  local fails
  fails=$(awk '{s+=$4} END {print s}' "$WORK/out")
  [ "$fails" -eq 0 ] || { echo "$2: $fails runs failed" >&2; cat "$WORK/out" >&2; exit 1; }
}

# A loopback redis-server for the benchmark, without persistence, killed on exit (its pid file is
# in WORK): its port in P, its URL in CRONLOCK_REDIS_URL, once it answers.
bench_redis() {
  P=$(free_port)
  redis-server --port "$P" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$WORK/redis.pid" \
    --dir "$WORK" >/dev/null
  export CRONLOCK_REDIS_URL=redis://127.0.0.1:$P
  for _ in $(seq 100); do redis-cli -p "$P" ping >/dev/null 2>&1 && break; sleep 0.05; done
}

# The start delays of FILE's lines ("INSTANT START ...": an RFC 3339 instant and a Unix time), in
# ms: "RUNS P50 P90 P99 MAX".
bench_delays() {
  python3 - "$1" <<'PY'
import sys, datetime
d = []
for line in open(sys.argv[1]):
    inst, start = line.split()[:2]
    t = datetime.datetime.fromisoformat(inst.replace("Z", "+00:00")).timestamp()
    d.append((float(start) - t) * 1000)
d.sort()
q = lambda p: d[min(len(d) - 1, int(p * len(d)))]
print(f"{len(d)} {q(0.5):.2f} {q(0.9):.2f} {q(0.99):.2f} {d[-1]:.2f}")
PY
}

# redis-cli on the benchmark's server (bench_redis), and the CPU it used so far (user + system
# seconds, INFO cpu).
R() { redis-cli -p "$P" "$@"; }
cpu() { R info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.4f", s}'; }

# This build and OTHER side by side as fresh copies, WORK/this and WORK/other (a build compared
# with another: bench-fleet-size, bench-renewals).
bench_two_builds() {
  cp "$1" "$WORK/other"
  cp "$BIN" "$WORK/this"
}

# Redis's idle housekeeping, CPU seconds a second, over 8 s with no client: IDLE.
bench_idle() {
  local c0 c1
  c0=$(cpu); sleep 8; c1=$(cpu)
  IDLE=$(python3 -c "print(($c1 - $c0) / 8)")
}
