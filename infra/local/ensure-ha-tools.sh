#!/usr/bin/env bash
# Install what `make test-ha` needs besides the two servers' own packages: iptables, with which
# the broker partition row cuts one cluster node off from the others. Does nothing when present.
set -euo pipefail

if ! command -v iptables >/dev/null; then
  "$(dirname "$0")/apt-install.sh" iptables
  command -v iptables >/dev/null
fi
