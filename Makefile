# `make test` and `make demo` bootstrap .venv themselves on a fresh machine.
# torch is pinned to the local CPU wheel; override with e.g. `make test TORCH=torch`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# under this checkout: two checkouts running the demo at once do not overwrite each other's stores
DEMO   ?= build/demo
# the suite on 2 worker processes, each test file on one of them (`make test PYTEST_ARGS=` runs it in one)
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: venv test demo bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

# the demo needs the library and matplotlib (for `mmreplay plot`), not the test extras
$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[plot]"
	touch $(DEMO_STAMP)

test: $(STAMP)
	$(BIN)/python tests/integrations/fetch_sb3_tests.py  # SB3's own buffer tests, fetched once (the suite stays on loopback)
	$(BIN)/pytest -q --durations=15 $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	rm -rf $(DEMO) $(DEMO)-cp $(DEMO)-run
	mkdir -p $(dir $(DEMO))
	$(BIN)/python examples/quickstart.py $(DEMO)
	$(BIN)/mmreplay info $(DEMO)
	$(BIN)/mmreplay collect CartPole-v1 --store $(DEMO)-cp --steps 2000 --seed 0 --envs-per-worker 8
	$(BIN)/mmreplay train CartPole-v1 --store $(DEMO)-cp --run-dir $(DEMO)-run --steps 60000 --eval-every 5000 --target-return 475
	$(BIN)/mmreplay plot $(DEMO)-run

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python benchmarks/run.py

# the API reference from the docstrings: build/reference/index.html, a page per module (fails on an
# undocumented public name or attribute, a module without a page, or a broken cross-reference, as
# tests/docs/test_reference.py does)
docs: $(STAMP)
	$(BIN)/python docs/reference.py build/reference

clean:
	rm -rf $(VENV) build dist *.egg-info
