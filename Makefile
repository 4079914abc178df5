# Two commands a newcomer needs: `make run` and `make test`. Everything else is a helper of those.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test install lint typecheck contracts services browser clean

# The stamp is rebuilt whenever the declared dependencies or the install script change.
$(STAMP): pyproject.toml scripts/install.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	VENV=$(VENV) bash scripts/run.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

test: $(STAMP)
	VENV=$(VENV) bash scripts/test.sh $(ARGS)

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
