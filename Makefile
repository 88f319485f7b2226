# The two commands of the README: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch first and pinned: on CPU machines this version is a local build, any other spec
# (or a package that asks for a newer torch) downloads a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test test-reliability install install-dev install-bench lint typecheck unit bench bench-overhead redis k8s-tools node-example codex-cli bench-fleet clean

# pip compiles what it installs one file at a time; compileall does it on every core
# (`make install-dev` on a 2-core AMD EPYC: 97 -> 65 s). A file written for a newer Python (torch
# ships one) fails to compile, as it does under pip, and is skipped.
COMPILE := $(PY) -m compileall -qq -j 0 $(VENV)/lib || true

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-compile "$(TORCH_SPEC)"
	$(PIP) install -q --no-compile -e .
	$(COMPILE)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(PIP) install -q --no-compile -e ".[dev]"
	$(COMPILE)
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-bench: $(VENV)/.installed-bench

# The tiny model, its smaller size as the light model it falls back to under load, and the tiny
# encoder for /v1/embeddings: all built offline on first use.
run: install
	$(VENV)/bin/surge serve --host $(HOST) --port $(PORT) --model tiny --model tiny-light=tiny:s --light-model tiny-light

lint: install-dev
	$(VENV)/bin/ruff check app models middleware tests scripts examples
	$(VENV)/bin/ruff format --check app models middleware tests scripts examples

typecheck: install-dev
	$(VENV)/bin/mypy

# The Redis tests start their own redis-server on free ports; the binary must exist.
redis:
	scripts/ensure-redis.sh

# tests/k8s builds the overlays with `kubectl kustomize` and scrapes surge with a real Prometheus.
k8s-tools:
	scripts/ensure-k8s-tools.sh

# tests/examples runs examples/node with its `openai` package; without npm (or when the install
# fails) the test skips and says so, rather than the whole run failing.
node-example:
	@if command -v npm >/dev/null 2>&1; then \
		(cd examples/node && npm install --no-audit --no-fund) || echo "npm install failed: tests/examples will skip the Node example"; \
	else echo "npm not found: tests/examples will skip the Node example"; fi

# tests/examples/test_codex.py runs the Codex CLI (npm @openai/codex, ~420 MB with its binary);
# without npm, or offline, the test skips and says so.
codex-cli:
	@if command -v npm >/dev/null 2>&1; then \
		(cd examples/codex && npm install --no-audit --no-fund) || echo "npm install failed: tests/examples will skip the Codex CLI"; \
	else echo "npm not found: tests/examples will skip the Codex CLI"; fi

# Two workers (pytest-xdist), a test file each at a time: most tests wait on a server, a child
# process or a timeout rather than compute, and on 2 cores the suite takes ~0.6x the time of one
# worker. A file stays on one worker, so its module-scoped servers start once; files go out in
# collection order, where tests/conftest.py puts the longest first. Tests marked
# `serial` judge timing under load (overload's hysteresis, the keys burst's fairness, stalled
# readers) and flaked, or may, beside a second worker: they run after, alone. Both parts run; the target fails if either did.
# TEST_WORKERS=0: everything on one worker.
# The serial run collects only the files that mark tests serial (collecting all ~2,000 tests is
# ~25 s on slow cores). PYTHONDONTWRITEBYTECODE= (empty: unset, for Python): where the
# environment sets it, no process wrote bytecode, so every pytest process assertion-rewrote
# every test module afresh (~12 s each) and every server the tests start compiled surge's own
# modules again.
TEST_WORKERS ?= 2
SERIAL_FILES = $(shell grep -rl --include='*.py' "mark.serial" tests)
unit: install-dev redis k8s-tools node-example codex-cli
ifeq ($(TEST_WORKERS),0)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q
else
	@status=0; export PYTHONDONTWRITEBYTECODE=; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not reliability and not serial" || status=1; \
	$(PY) -m pytest -q -m "serial and not reliability" $(SERIAL_FILES) || status=1; \
	exit $$status
endif

# lint and typecheck beside the tests: on 2 cores the tests leave part of a core idle (they wait on
# servers and timeouts), and a cold mypy is ~40 s of one.
test:
	@$(MAKE) --no-print-directory -j3 lint typecheck unit

# The full reliability runs (scripts/reliability/, about 30 minutes on 2 cores; `make test` runs their
# fast versions): overload at 3x capacity for 60 s, a burst from ten keys, a 20-minute soak, then the
# long fault tests (`-m reliability`). Every part runs; the target fails if any did.
RELIABILITY_OUT ?= bench-results/reliability
test-reliability: install-dev
	@mkdir -p $(RELIABILITY_OUT); status=0; \
	$(PY) -m scripts.reliability.overload --out $(RELIABILITY_OUT)/overload.md || status=1; \
	$(PY) -m scripts.reliability.keys_burst --out $(RELIABILITY_OUT)/keys_burst.md || status=1; \
	$(PY) -m scripts.reliability.soak --out $(RELIABILITY_OUT)/soak.md || status=1; \
	$(PY) -m pytest -q -m reliability || status=1; \
	exit $$status

# The bench extra names torch only through transformers[serving] (torch>=2.6): pinning it in the same
# command keeps pip from swapping the CPU build for a multi-GB CUDA one.
$(VENV)/.installed-bench: $(VENV)/.installed-dev pyproject.toml
	$(PIP) install -q --no-compile -e ".[bench]" "$(TORCH_SPEC)"
	$(COMPILE)
	touch $@

BENCH_ARGS ?= --model-size m --concurrency 1,8,32,64 --rounds 3

bench: $(VENV)/.installed-bench
	$(PY) -m scripts.bench $(BENCH_ARGS)

# Two replicas behind vllm-router: later turns' TTFT and prefix-hit share, round-robin against
# cache-aware and kv-aware routing (scripts/bench_fleet.py, docs/fleet.md).
bench-fleet: install-dev
	$(PY) -m scripts.bench_fleet

# Serving overhead alone: surge on `--model echo` against a bare Starlette SSE endpoint.
bench-overhead: install-dev
	$(PY) -m scripts.overhead

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
