# Two commands do all set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000
# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= cpu,dev,ray
DEMO_INDEX ?= data/demo-index
export HF_HUB_OFFLINE ?= 1

.PHONY: install serve test lint demo-index browser clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $@

demo-index: install
	$(VENV)/bin/cloze index build --input app/demo/corpus.jsonl.gz --out $(DEMO_INDEX) --skip-if-current

serve: demo-index
	CLOZE_INDEX=$${CLOZE_INDEX:-$(DEMO_INDEX)} $(VENV)/bin/cloze serve --host $(HOST) --port $(PORT)

# The playground tests drive Debian's chromium (never `playwright install`).
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: lint browser
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Style, and the layers of docs/architecture.md: import-linter's contracts live in pyproject.toml.
lint: install
	$(VENV)/bin/ruff check app encoder_training index encoder_runtime tests benchmarks
	$(VENV)/bin/ruff format --check app encoder_training index encoder_runtime tests benchmarks
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) data/demo-index
