# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv

.PHONY: run test

run: $(VENV)/.installed
	$(VENV)/bin/python -m app.devstack run

test: $(VENV)/.installed
	$(VENV)/bin/python -m app.devstack test

# Pinned dependencies (requirements.lock), re-installed when they change.
$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@
