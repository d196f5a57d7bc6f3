#!/usr/bin/env bash
# Install the command-line tools the tests run besides Python, Node and the two servers, from
# Debian's packages: Prometheus and promtool (`prometheus`: the alert rules are checked and tested
# with promtool, and a test scrapes the services with a real Prometheus) and Chromium (`chromium`:
# Playwright drives it through the web console; Playwright's own browser download needs a host
# the machines do not reach). Used by `make test` and CI; does nothing when they are there.
set -euo pipefail

missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing Debian packages: ${missing[*]}; install them" \
       "(apt-get install --no-install-recommends ${missing[*]})" >&2
  exit 1
fi
echo "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends keeps node-exporter out. The tests run their own server on ports of their
# own, so a packaged service the install may start (port 9090) is left alone.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
command -v promtool >/dev/null
[ -x /usr/bin/chromium ]
