# Studio: `make run` serves it, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# The services pass: PostgreSQL and Redis on this machine.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1
PYTEST_ARGS ?=

.PHONY: run test lint fmt fresh-host screenshots

$(VENV)/.runtime: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit("Studio needs Python 3.11+") if sys.version_info < (3, 11) else None'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	touch $@

run: $(VENV)/.runtime
	./scripts/ensure-system-packages --optional bubblewrap:bwrap
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_login
	@echo "Serving Studio on http://$(HOST):$(PORT)/ (Ctrl-C stops it)"
	$(VENV)/bin/daphne -b $(HOST) -p $(PORT) studio.asgi:application

# The OpenID Connect provider the sign-in tests run (tests/oidc/provider.mjs).
tests/oidc/node_modules/.installed: tests/oidc/package.json tests/oidc/package-lock.json
	./scripts/ensure-system-packages nodejs:node npm:npm
	npm ci --prefix tests/oidc --no-audit --no-fund --loglevel=error
	touch $@

test: $(VENV)/.dev tests/oidc/node_modules/.installed
	./scripts/ensure-system-packages chromium:chromium bubblewrap:bwrap python3-matplotlib:py:matplotlib nginx:nginx openssl:openssl prometheus:prometheus systemd:systemd-analyze
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo "== pass 1: SQLite + in-memory channel layer, browser tests included"
	env -u DATABASE_URL -u REDIS_URL $(PY) -m pytest -m "not services" $(PYTEST_ARGS)
	@echo "== pass 2: PostgreSQL + Redis ($(TEST_DATABASE_URL), $(TEST_REDIS_URL))"
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest -m "services or anydb" $(PYTEST_ARGS)

# The README's Production steps, verbatim, on a bare Debian 12 booted under
# systemd-nspawn, to a gated call through nginx (tests/fresh_host/run.py; root).
fresh-host:
	./scripts/ensure-system-packages debootstrap:debootstrap systemd-container:systemd-nspawn
	$(PYTHON) tests/fresh_host/run.py

# The README's screenshots (docs/screenshots/), taken by the browser tests.
screenshots: $(VENV)/.dev
	env -u DATABASE_URL -u REDIS_URL STUDIO_UPDATE_SCREENSHOTS=1 $(PY) -m pytest -m browser -q \
		-k "pending or allow or plot or inbox_filters or approvals_list_fits_1280 or dashboard_draws or running_call"

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: $(VENV)/.dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
