#!/usr/bin/env bash
# Install what `make test-ha` needs besides the two servers' own packages: iptables, with which
# the broker partition row cuts one cluster node off from the others. Does nothing when present.
set -euo pipefail

if command -v iptables >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "iptables is missing; install Debian's 'iptables' package (apt-get install --no-install-recommends" \
       "iptables) or put it on PATH" >&2
  exit 1
fi
echo "installing iptables"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends iptables >/dev/null
command -v iptables >/dev/null
