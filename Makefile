# The two commands of the README: `make run` and `make test`. For the inner loop: `make lint` runs
# the quality gates alone (no database, no tests), `make fmt` formats and fixes what ruff can.
PYTHON ?= python3.11
VENV := .venv

.PHONY: run test lint fmt

run: $(VENV)/.installed
	$(VENV)/bin/python -m app.devstack run

test: $(VENV)/.installed
	$(VENV)/bin/python -m app.devstack test

lint: $(VENV)/.installed
	$(VENV)/bin/python -m app.devstack lint

fmt: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Pinned dependencies (requirements.lock, and package-lock.json for the browser's chart library,
# uPlot, served from node_modules/ as static files), re-installed when they change.
$(VENV)/.installed: requirements.lock pyproject.toml app/domain/_chain.c app/domain/_stack.c package-lock.json
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	npm ci --silent --no-audit --no-fund
	touch $@
