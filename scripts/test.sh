#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian/Ubuntu machine: installs what the tests need
# (redis-server, which also runs the Sentinel tests' sentinels; redis-cli from redis-tools, which
# creates the Cluster tests' cluster; openssl for the TLS tests' certificates, python3-prometheus-client for the
# metrics tests; a Rust toolchain must already be
# there) and runs them. The tests fail, never skip, when a server they need is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The metrics tests parse .prom files with the Prometheus project's own parser.
/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || need+=(python3-prometheus-client)
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
/usr/bin/python3 -c 'import prometheus_client' ||
  { echo "test.sh: python3-prometheus-client is required" >&2; exit 1; }

cargo test --locked "$@"
