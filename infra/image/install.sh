#!/bin/sh
# Usage: install.sh VENV LOCK WHEEL_DIR
# A fresh virtual environment holding exactly the locked dependencies (every file checked against its
# hash, wheels only: nothing is compiled in the image), then our wheels from WHEEL_DIR without
# dependencies and from nowhere else; pip check fails when a wheel needs what the lock lacks. Run by
# the Dockerfile and by tests/integration/test_image_install.py, so the test installs what the image does.
set -eu
venv=$1
lock=$2
wheels=$3
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-cache-dir --require-hashes --only-binary=:all: -r "$lock"
"$venv/bin/python" -m pip install --quiet --no-cache-dir --no-deps --no-index "$wheels"/*.whl
"$venv/bin/python" -m pip check
