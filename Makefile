# longrun: `make run` brings everything up and runs the main job; `make test` runs every tier.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PARTITIONS ?= 8
DELIVERY_LIMIT ?= 5
INGRESS_MAX_LENGTH ?= 100000
INGRESS_MAX_BYTES ?= 104857600

.PHONY: install lock services test-services tools migrate topology schemas monitoring run test node-deps test-unit test-integration clean bench bench-scale chaos test-ha test-packaging fuzz dist

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Dependencies from the lock only (every file checked against its hash), then our own packages
# editable and without dependencies; pip check fails when a pyproject needs what the lock lacks
# (then run `make lock`).
install: $(PY)
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps -e clients/python -e . -e examples/dependency_upgrade \
		-e examples/research_agent
	$(PY) -m pip check

# requirements/*.txt from requirements/*.in and the pyproject files (requirements/README.md): dev.txt
# first, then runtime.txt within it, then example.txt within both, so the images run the versions CI tests. UPGRADE=1 moves every
# pin to the newest allowed release. Only the lock's own tools are installed first: a pyproject that
# gained a dependency cannot pass `make install` before this runs.
LOCK := $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" \
	--no-emit-package longrun-runtime --no-emit-package longrun-client $(if $(UPGRADE),--upgrade)
lock: $(PY)
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(LOCK) --no-emit-package longrun-example-dependency-upgrade \
		--no-emit-package longrun-example-research-agent -o requirements/dev.txt requirements/dev.in
	$(LOCK) -c requirements/dev.txt -o requirements/runtime.txt requirements/runtime.in
	$(LOCK) --no-emit-package longrun-example-dependency-upgrade -c requirements/dev.txt -c requirements/runtime.txt \
		-o requirements/example.txt requirements/example.in

services:
	bash infra/local/ensure-services.sh

# The tests can also start PostgreSQL and RabbitMQ with testcontainers, where a Docker engine answers.
test-services:
	bash infra/local/ensure-services.sh --or-containers

# Prometheus and promtool (Debian's package): the alert rules' tests and the scrape test run them.
# Chromium (Debian's package): Playwright drives it through the web console's test.
tools:
	bash infra/local/ensure-tools.sh

migrate: install services
	$(PY) -m longrun.db.migrate upgrade

# Generated files: never edit them by hand; tests fail when they drift.
topology: install
	$(PY) -c "from longrun.bus.topology import render_definitions as r; \
	open('infra/rabbitmq/definitions.json','w').write(r(partitions=$(PARTITIONS), delivery_limit=$(DELIVERY_LIMIT), \
	ingress_max_length=$(INGRESS_MAX_LENGTH), ingress_max_bytes=$(INGRESS_MAX_BYTES)))"

schemas: install
	$(PY) -m longrun.envelope.export schemas
	$(PY) -m longrun.bus.asyncapi schemas/asyncapi.yaml
	$(PY) -m longrun.config_reference docs/configuration.md
	$(PY) -m longrun.services.gateway.openapi schemas/openapi.json

# The alert rules (plain Prometheus rules and the PrometheusRule manifest) and the Grafana dashboard,
# from longrun.monitoring.
monitoring: install
	$(PY) -m longrun.monitoring

# The sdist and wheel of every distribution of ours (the runtime, the client, the example kinds) in
# dist/, checked as the package index would check them.
DISTRIBUTIONS := . clients/python examples/dependency_upgrade examples/research_agent
dist: install
	rm -rf dist
	set -e; for d in $(DISTRIBUTIONS); do $(PY) -m build --outdir dist $$d; done
	$(PY) -m twine check --strict dist/*

run: install migrate
	$(PY) -m longrun_dependency_upgrade.demo

# The Node.js clients' locked dependencies: the amqplib example and the AsyncAPI contract check.
NODE_DIRS := examples/node tests/contract
node-deps:
	set -e; for d in $(NODE_DIRS); do \
	  if [ -f $$d/package-lock.json ]; then npm ci --prefix $$d --no-audit --no-fund; \
	  else npm install --prefix $$d --no-audit --no-fund; fi; \
	done

# Every tier but the fault matrix and the short chaos run (make test-faults), the packaging tests and
# the HA tests, each a target of its own that .ci/run runs after this one. It must stay under 25 minutes
# on a slow day: the slowest tests are listed at its end, the first to move to test-long.
test: install test-services tools node-deps
	$(PY) -m pytest --ignore=tests/fault --ignore=tests/chaos --durations=25

# The fault matrix (docs/fault-matrix.md) and the short randomized chaos run: they restart the local
# PostgreSQL and RabbitMQ and kill services (~10 minutes). Not part of `make test`; .ci/run runs it after.
test-faults: install test-services tools
	$(PY) -m pytest tests/fault tests/chaos

test-unit: install tools
	$(PY) -m pytest tests/unit

test-integration: install test-services tools
	$(PY) -m pytest tests/integration

# The slowest integration and security tests, ten seconds or more each on a slow day (many runs at once,
# ten thousand finished runs, the main job, schemathesis against the live gateway, the longest outage,
# reminder and deadline stories, whole runs under a tenant's broker user, the bench's timeline phase:
# ~10-20 minutes). Not part of `make test`, which stays under 25 minutes; .ci/run runs it after.
test-long: install test-services tools
	$(PY) -m pytest -m long tests/integration tests/security

# Our distributions built and installed in fresh venvs: the image's runtime target replayed, a kind
# run outside the tree, the client alone, every wheel through twine check (~2 minutes). Not part of
# `make test`; .ci/run runs it after.
test-packaging: install test-services tools
	$(PY) -m pytest -m packaging

# Replicated infrastructure of the tests' own (a PostgreSQL primary and synchronous standby, a
# three-node RabbitMQ cluster), faults over it (docs/deployment.md). Not part of `make test`;
# .ci/run runs it after.
test-ha: install services
	bash infra/local/ensure-ha-tools.sh
	$(PY) -m pytest -m ha tests/ha

# Not part of `make test`: ~12 minutes (BENCH_QUICK=1: ~3-5). Own database and vhost; see docs/cost-model.md.
# The peers: the `bench` extra, and the Restate server from its locked npm package (without its install
# scripts, which only report usage).
bench: install services
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	npm ci --prefix bench/restate --ignore-scripts --no-audit --no-fund --loglevel=error
	$(PY) -m bench --json var/bench/$$(date -u +%Y%m%dT%H%M%SZ).json

# A million parked runs (not part of `make bench`: ~20 minutes): storage, sweeps, the metrics read,
# idle CPU and 10,000 woken at once, at each of BENCH_SCALE_RUNS (docs/cost-model.md).
bench-scale: install services
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	BENCH_PHASES=million $(PY) -m bench --json var/bench/scale-$$(date -u +%Y%m%dT%H%M%SZ).json

# The long randomized chaos run (the short one is part of `make test`): CHAOS_MINUTES of random
# kills, pauses and forge faults while runs keep coming, then settling and the invariant checker.
# CHAOS_SEED=<seed> replays a run's fault script; figures are printed and kept in var/chaos/.
CHAOS_MINUTES ?= 30
chaos: install services
	CHAOS_MINUTES=$(CHAOS_MINUTES) $(PY) -m pytest tests/chaos -s -p no:cacheprovider

# The long hostile-input run (the short one, 500 messages, is part of `make test`): FUZZ_MESSAGES
# generated messages and webhooks at a running ensemble, every one accounted for. FUZZ_SEED=<seed>
# replays the same messages; figures are printed and kept in var/fuzz/.
FUZZ_MESSAGES ?= 5000
fuzz: install services
	FUZZ_MESSAGES=$(FUZZ_MESSAGES) $(PY) -m pytest tests/fuzz -s -p no:cacheprovider

clean:
	rm -rf var build *.egg-info
