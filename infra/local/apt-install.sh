#!/usr/bin/env bash
# Install Debian packages for the test tools (the ensure-*.sh scripts name them): as root through
# apt-get, without recommended packages (they would bring services the tests do not want, such as
# node-exporter); anywhere else, say which packages are missing and how to install them.
set -euo pipefail

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing Debian packages: $*; install them (apt-get install --no-install-recommends $*)" >&2
  exit 1
fi
echo "installing $*"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The tests run their own servers on ports of their own, so a packaged service the install may
# start (Prometheus on 9090) is left alone.
apt-get install -y -qq --no-install-recommends "$@" >/dev/null
