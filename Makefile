# Two commands a newcomer needs: `make run` and `make test`. Everything else is a helper of those.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test install lint typecheck contracts services browser clean agent

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

# An engine host of a hardware pool: `make agent POOL=h200-us-east` (a Celery worker on the
# pool's queue; DATABASE_URL and CELERY_BROKER_URL must reach the portal's database and broker).
agent: $(STAMP)
	@test -n "$(POOL)" || (echo "usage: make agent POOL=<pool name>" >&2; exit 2)
	$(BIN)/tailguard agent --pool $(POOL)
