#!/usr/bin/env bash
# Quick start on a Debian/Ubuntu machine, from a checkout:
#  0. checks what the build needs (a C compiler for `ring`, Rust >= the `rust-version` in
#     Cargo.toml) and says how to get what is missing (it installs gcc with apt-get itself),
#  1. builds the static cronlock binary (outside the checkout: nothing is left in it),
#  2. installs it into $PREFIX/bin (default /usr/local/bin), with its man page and its bash, zsh
#     and fish completions under $PREFIX/share, where man and the shells look,
#  3. installs redis-server if missing and, if nothing answers on 127.0.0.1:$REDIS_PORT (6379),
#     starts a demo Redis whose files live in a temporary directory, and says how to stop it,
#  4. runs a job under a lock, shows what Redis recorded of it, and prints a crontab line that
#     works as it is (and how to add it where there is no cron or no editor): cron runs jobs with
#     PATH=/usr/bin:/bin, where /usr/local/bin is not, so the line names cronlock by its full path.
# PREFIX=$HOME/.local installs into ~/.local; BIN=path installs that binary instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -t 2 ]; then
  say() { printf '\033[1mquickstart:\033[0m %s\n' "$*" >&2; }
else
  say() { printf 'quickstart: %s\n' "$*" >&2; }
fi
PREFIX=${PREFIX:-/usr/local}
REDIS_PORT=${REDIS_PORT:-6379}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
# Install into $PREFIX, with sudo when it is not writable.
put() {
  local mode=$1 from=$2 to=$3
  if [ -w "$PREFIX" ] || [ -w "$(dirname "$to")" ]; then
    install -D -m"$mode" "$from" "$to"
  elif command -v sudo >/dev/null 2>&1; then
    sudo install -D -m"$mode" "$from" "$to"
  else
    say "cannot install $to: $PREFIX is not writable by $(id -un) and sudo is missing;"
    say "run this as root, or choose another place: PREFIX=\$HOME/.local $0"
    exit 1
  fi
}

if [ -z "${BIN:-}" ]; then
  say "step 0/4: checking what the build needs"
  if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      say "no C compiler (the 'ring' crate builds C): installing gcc with apt-get"
      as_root apt-get update -qq
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq gcc >/dev/null
    else
      say "no C compiler: install gcc (the 'ring' crate builds C), then run this again"
      exit 1
    fi
  fi
  if [ ! -e /etc/ssl/certs/ca-certificates.crt ]; then
    if command -v apt-get >/dev/null 2>&1; then
      say "no CA certificates (cargo fetches the crates over TLS): installing ca-certificates"
      as_root apt-get update -qq
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq ca-certificates >/dev/null
    else
      say "no CA certificates (cargo fetches the crates over TLS): install ca-certificates, then"
      say "run this again"
      exit 1
    fi
  fi
  need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
  # rustup puts cargo in ~/.cargo/bin, on PATH only in a new login shell (or after
  # `. ~/.cargo/env`): use it from there.
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    say "using rustup's cargo in $HOME/.cargo/bin (not on PATH in this shell: run"
    say "'. ~/.cargo/env' or open a new login shell to have it there)"
    PATH="$HOME/.cargo/bin:$PATH"
  fi
  have=$(cargo --version 2>/dev/null | awk '{print $2}' || true)
  if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    say "Rust $need or newer is needed, found ${have:-no cargo}. Debian's own cargo is too old:"
    say "install Rust with rustup (https://rustup.rs), then run this again"
    exit 1
  fi
  BUILD_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/cronlock-build
  say "step 1/4: building cronlock (static, release) in $BUILD_DIR; the first build takes about a minute on 2 cores"
  CARGO_TARGET_DIR="$BUILD_DIR" cargo build --release --locked
  BIN="$BUILD_DIR/x86_64-unknown-linux-gnu/release/cronlock"
else
  say "step 1/4: using $BIN (BIN is set): nothing to build"
fi

say "step 2/4: installing $PREFIX/bin/cronlock, its man page and shell completions"
put 755 "$BIN" "$PREFIX/bin/cronlock"
put 644 man/cronlock.1 "$PREFIX/share/man/man1/cronlock.1"
put 644 completions/cronlock.bash "$PREFIX/share/bash-completion/completions/cronlock"
put 644 completions/_cronlock "$PREFIX/share/zsh/site-functions/_cronlock"
put 644 completions/cronlock.fish "$PREFIX/share/fish/vendor_completions.d/cronlock.fish"

say "step 3/4: Redis on 127.0.0.1:$REDIS_PORT"
if ! command -v redis-server >/dev/null 2>&1; then
  say "installing redis-server and redis-tools with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server redis-tools >/dev/null
fi
if redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  say "a Redis already answers there: using it"
else
  DEMO_DIR=$(mktemp -d /tmp/cronlock-demo-redis.XXXXXX)
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes --dir "$DEMO_DIR" --save '' \
    --appendonly no --pidfile "$DEMO_DIR/redis.pid" --logfile "$DEMO_DIR/redis.log" >/dev/null
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
  say "started a demo redis-server on 127.0.0.1:$REDIS_PORT; its files are in $DEMO_DIR, not here"
  say "stop it with: redis-cli -p $REDIS_PORT shutdown nosave && rm -r $DEMO_DIR"
fi

say "step 4/4: running a job under the lock 'hello'"
"$PREFIX/bin/cronlock" -u "redis://127.0.0.1:$REDIS_PORT" hello -- \
  sh -c 'echo "ran under the lock, fencing token $CRONLOCK_FENCING_TOKEN"'
say "what Redis recorded of that run (any host can ask):"
"$PREFIX/bin/cronlock" -u "redis://127.0.0.1:$REDIS_PORT" --status hello >&2
if command -v man >/dev/null 2>&1; then
  say "done: try 'man cronlock'. A crontab line for every host, as it is:"
else
  say "done: the manual is $PREFIX/share/man/man1/cronlock.1 (install man-db to read it with"
  say "'man cronlock'). A crontab line for every host, as it is:"
fi
LINE="* * * * * $PREFIX/bin/cronlock -u redis://127.0.0.1:$REDIS_PORT hello -- date"
say "  $LINE"
# A crontab line needs cron to run it; a minimal system has none (and no editor for crontab -e).
if command -v crontab >/dev/null 2>&1; then
  say "add it with 'crontab -e', or without an editor:"
else
  say "there is no cron here: install it first (as root: apt-get install cron), then add it"
  say "with 'crontab -e', or without an editor:"
fi
say "  (crontab -l 2>/dev/null; echo '$LINE') | crontab -"
say "cron mails a job's output, which a system without a mail program drops: see what the line"
say "did, on any host, with: cronlock -u redis://127.0.0.1:$REDIS_PORT --status --history hello"
