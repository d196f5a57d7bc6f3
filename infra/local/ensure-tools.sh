#!/usr/bin/env bash
# Install the command-line tools the tests run besides Python, Node and the two servers:
# Prometheus and promtool (Debian's `prometheus` package: the alert rules are checked and
# tested with promtool, and a test scrapes the services with a real Prometheus). Used by
# `make test` and CI; does nothing when they are there.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "prometheus and promtool are missing; install Debian's 'prometheus' package" \
       "(apt-get install --no-install-recommends prometheus) or put both on PATH" >&2
  exit 1
fi
echo "installing prometheus (promtool)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends keeps node-exporter out. The tests run their own server on ports of their
# own, so a packaged service the install may start (port 9090) is left alone.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null
