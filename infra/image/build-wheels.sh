#!/bin/sh
# Usage: build-wheels.sh OUT_DIR PROJECT_DIR...
# A wheel of each of our projects, without their dependencies (those come from the lock). Run by the
# Dockerfile's builder stage and by tests/integration/test_image_install.py, so both build alike.
set -eu
out=$1
shift
"${PYTHON:-python3}" -m pip wheel --quiet --no-cache-dir --no-deps --wheel-dir "$out" "$@"
