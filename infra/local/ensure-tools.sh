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
"$(dirname "$0")/apt-install.sh" "${missing[@]}"
command -v promtool >/dev/null
[ -x /usr/bin/chromium ]
