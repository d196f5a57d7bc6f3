# longrun: `make run` brings everything up and runs the main job; `make test` runs every tier.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PARTITIONS ?= 8
DELIVERY_LIMIT ?= 5

.PHONY: install services migrate topology schemas run test test-unit test-integration clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

install: $(PY)
	$(PY) -m pip install --quiet -e ".[dev]"

services:
	bash infra/local/ensure-services.sh

migrate: install services
	$(PY) -m longrun.db.migrate upgrade

# Generated files: never edit them by hand; tests fail when they drift.
topology: install
	$(PY) -c "from longrun.bus.topology import render_definitions as r; \
	open('infra/rabbitmq/definitions.json','w').write(r(partitions=$(PARTITIONS), delivery_limit=$(DELIVERY_LIMIT)))"

schemas: install
	$(PY) -m longrun.envelope.export schemas

run: install migrate
	$(PY) -m longrun.demo.up

test: install services
	$(PY) -m pytest

test-unit: install
	$(PY) -m pytest tests/unit

test-integration: install services
	$(PY) -m pytest tests/integration

clean:
	rm -rf var build *.egg-info
