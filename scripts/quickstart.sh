#!/usr/bin/env bash
# Quick start on a fresh Debian/Ubuntu machine with a Rust toolchain: install redis-server if it is
# missing, start it on 127.0.0.1:6379 if nothing answers there, install cronlock, run a job under it.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v redis-server >/dev/null 2>&1; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --bind 127.0.0.1 --port 6379 --daemonize yes >/dev/null
  for _ in $(seq 50); do redis-cli ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
cargo install --locked --quiet --path .
export PATH="$HOME/.cargo/bin:$PATH"
cronlock -v hello -- sh -c 'echo "ran under the lock, fencing token $CRONLOCK_FENCING_TOKEN"'
