# Two commands do all set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000
# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# `make serve` installs what serving needs (the project and ONNX Runtime, as the Docker image does); `make test`
# and the other developer targets add the tests' tools and Ray (its engine is tested) on top: tests/test_setup.py.
SERVE_EXTRAS ?= cpu
EXTRAS ?= cpu,dev,ray
DEMO_INDEX ?= data/demo-index
export HF_HUB_OFFLINE ?= 1

.PHONY: install install-serve serve test test-fast lint demo-index browser clean docker-engine test-deploy test-deploy-replicas test-replicas gpu-image

install: $(VENV)/.installed
install-serve: $(VENV)/.installed-serve

# Each install in one pip call (`EXTRAS=gpu,dev` must never meet the `cpu` extra's onnxruntime); the full one
# holds what serving needs as well, so it marks both.
define pip_install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[$(1)]"
endef

$(VENV)/.installed-serve: pyproject.toml
	$(call pip_install,$(SERVE_EXTRAS))
	touch $@

$(VENV)/.installed: pyproject.toml
	$(call pip_install,$(EXTRAS))
	touch $@ $(VENV)/.installed-serve

demo-index: install-serve
	$(VENV)/bin/cloze index build --input app/demo/corpus.jsonl.gz --out $(DEMO_INDEX) --skip-if-current

serve: demo-index
	CLOZE_INDEX=$${CLOZE_INDEX:-$(DEMO_INDEX)} $(VENV)/bin/cloze serve --host $(HOST) --port $(PORT)

# The playground tests drive Debian's chromium (never `playwright install`).
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: lint browser
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The edit-run loop: unit tests only (no real server, no Docker, no training runs, no browser); `make test`
# stays the whole suite and CI's command.
FAST_TESTS := tests/app tests/encoder_runtime tests/index tests/cloze_search tests/encoder_training/test_masking.py $(wildcard tests/test_*.py)
test-fast: install
	$(PY) -m pytest -q -m "not slow and not docker" $(FAST_TESTS) $(PYTEST_ARGS)

# The deployment for real (not part of `make test`): a Docker engine (Debian's docker.io, started here
# when no daemon answers), local base images, the CPU image and the compose stack end to end.
# tests/deploy/test_stack.py says what is checked; figures land in test-artifacts/deploy/stack.json.
DEPLOY_ARTIFACTS := test-artifacts/deploy
docker-engine:
	command -v dockerd >/dev/null && command -v debootstrap >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null)
	docker info >/dev/null 2>&1 || (nohup dockerd >/var/log/dockerd.log 2>&1 & \
		for i in $$(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done; docker info >/dev/null)

test-deploy: install
	@mkdir -p $(DEPLOY_ARTIFACTS) && date +%s.%N > $(DEPLOY_ARTIFACTS)/engine-started
	$(MAKE) --no-print-directory docker-engine
	@date +%s.%N > $(DEPLOY_ARTIFACTS)/engine-ready
	$(PY) -m pytest -q -m docker tests/deploy/test_stack.py $(PYTEST_ARGS)

# Replication across hosts in Docker (not part of `make test`): the compose file's `replicas` profile with
# stand-in images, writer, two replicas and the bucket each in a container; tests/deploy/test_replicas.py
# says what is checked; figures land in test-artifacts/deploy/replicas.json.
test-deploy-replicas: install
	$(MAKE) --no-print-directory docker-engine
	$(PY) -m pytest -q -m docker tests/deploy/test_replicas.py $(PYTEST_ARGS)

# Replication across hosts, on loopback (not part of `make test`): a moto S3 server, a writer and two
# replicas as `cloze serve` processes; the tests 1-10 of tests/replication/. 3 to 7 minutes on 2 cores.
test-replicas: install
	$(PY) -m pytest -q -m replicas tests/replication $(PYTEST_ARGS)

# The GPU image (CUDA torch and onnxruntime-gpu from the package index) on the local Debian base; it
# is built and measured only, since it cannot run without a GPU. Not part of test-deploy (size, time).
gpu-image: install docker-engine
	$(PY) -m tests.deploy.images gpu

# Style, and the layers of docs/architecture.md: import-linter's contracts live in pyproject.toml.
lint: install
	$(VENV)/bin/ruff check app encoder_training index encoder_runtime cloze_search evaluation harness tests benchmarks tools
	$(VENV)/bin/ruff format --check app encoder_training index encoder_runtime cloze_search evaluation harness tests benchmarks tools
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) data/demo-index
