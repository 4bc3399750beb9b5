#!/usr/bin/env bash
# Release artifacts in dist/ (ignored by git):
#   dist/cronlock                      the static binary (runs anywhere: scratch images, chroots)
#   dist/cronlock_VERSION_amd64.deb    /usr/bin/cronlock, man page, bash/zsh/fish completions
#   dist/SHA256SUMS
# Installs cargo-deb (cargo install --locked) when it is missing.
# Usage: scripts/dist.sh
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'dist.sh: %s\n' "$*" >&2; }

TARGET=x86_64-unknown-linux-gnu # build.target in .cargo/config.toml: static by default
BIN=target/$TARGET/release/cronlock
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

say "building the static release binary (cargo build --release --locked; a few minutes the first time)"
cargo build --release --locked
if ldd "$BIN" 2>/dev/null | grep -q 'libc.so'; then
  say "$BIN is dynamically linked; is .cargo/config.toml in place?"
  exit 1
fi

if ! cargo deb --version >/dev/null 2>&1; then
  say "installing cargo-deb (cargo install cargo-deb --locked)"
  cargo install cargo-deb --locked
fi

rm -rf dist
mkdir -p dist
cp "$BIN" dist/cronlock
say "building the Debian package with cargo-deb"
cargo deb --no-build --locked --target "$TARGET" --output "dist/cronlock_${VERSION}_amd64.deb" >/dev/null
(cd dist && sha256sum cronlock "cronlock_${VERSION}_amd64.deb" > SHA256SUMS)

say "done:"
for f in dist/cronlock "dist/cronlock_${VERSION}_amd64.deb" dist/SHA256SUMS; do
  printf '  %-36s %s\n' "$f" "$(du -h "$f" | cut -f1)" >&2
done
say "install with: sudo apt install ./dist/cronlock_${VERSION}_amd64.deb   or   sudo install -m755 dist/cronlock /usr/local/bin/"
