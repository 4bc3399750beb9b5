#!/usr/bin/env bash
# Quick start on a Debian/Ubuntu machine with a Rust toolchain, from a checkout:
#  1. builds the static cronlock binary (outside the checkout: nothing is left in it),
#  2. installs it into /usr/local/bin, which is on cron's PATH (/usr/bin:/bin is not enough for
#     ~/.cargo/bin, so a crontab line would fail with 127 there),
#  3. installs redis-server if missing and, if nothing answers on 127.0.0.1:6379, starts a demo
#     Redis whose files live in a temporary directory, and says how to stop it,
#  4. runs a job under a lock.
# Set PREFIX to install elsewhere (PREFIX=$HOME/.local installs into ~/.local/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1mquickstart:\033[0m %s\n' "$*" >&2; }
PREFIX=${PREFIX:-/usr/local}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

BUILD_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/cronlock-build
say "step 1/4: building cronlock (static, release) in $BUILD_DIR; the first build takes a few minutes"
CARGO_TARGET_DIR="$BUILD_DIR" cargo build --release --locked
BIN="$BUILD_DIR/x86_64-unknown-linux-gnu/release/cronlock"

say "step 2/4: installing $BIN as $PREFIX/bin/cronlock"
if [ -w "$PREFIX/bin" ] || { [ ! -e "$PREFIX/bin" ] && [ -w "$PREFIX" ]; }; then
  install -D -m755 "$BIN" "$PREFIX/bin/cronlock"
elif command -v sudo >/dev/null 2>&1; then
  say "$PREFIX/bin is not writable by $(id -un): using sudo"
  sudo install -D -m755 "$BIN" "$PREFIX/bin/cronlock"
else
  say "cannot install: $PREFIX/bin is not writable by $(id -un) and sudo is missing;"
  say "run this as root, or choose another place: PREFIX=\$HOME/.local $0"
  exit 1
fi
case ":/usr/bin:/bin:/usr/local/bin:" in
  *":$PREFIX/bin:"*) ;;
  *) say "note: $PREFIX/bin is not on cron's default PATH; set PATH= in your crontab" ;;
esac

say "step 3/4: Redis on 127.0.0.1:6379"
if ! command -v redis-server >/dev/null 2>&1; then
  say "installing redis-server and redis-tools with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server redis-tools >/dev/null
fi
if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  say "a Redis already answers there: using it"
else
  DEMO_DIR=$(mktemp -d /tmp/cronlock-demo-redis.XXXXXX)
  redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --dir "$DEMO_DIR" --save '' \
    --appendonly no --pidfile "$DEMO_DIR/redis.pid" --logfile "$DEMO_DIR/redis.log" >/dev/null
  for _ in $(seq 100); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.05; done
  say "started a demo redis-server on 127.0.0.1:6379; its files are in $DEMO_DIR, not here"
  say "stop it with: redis-cli -p 6379 shutdown nosave && rm -r $DEMO_DIR"
fi

say "step 4/4: running a job under the lock 'hello'"
"$PREFIX/bin/cronlock" -v -u redis://127.0.0.1:6379 hello -- \
  sh -c 'echo "ran under the lock, fencing token $CRONLOCK_FENCING_TOKEN"'
say "done. A crontab line (crontab -e) to try on every host:"
say "  * * * * * CRONLOCK_REDIS_URL=redis://127.0.0.1:6379 cronlock hello -- date"
