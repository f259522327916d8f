# The two commands of the README: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: install docs demo test test-unit test-integration fuzz lint dist bench bench-ledger bench-smoke bench-overload matrix matrix-unit matrix-env matrix-unit-env celery-compat beat-compat celery-integration clean screenshots browser chaos chaos-soak chaos-rabbitmq matrix-configs

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

## The virtualenv with everything the tests, the linters and the docs need.
install: $(INSTALLED)

## Run the shop story on the embedded default (SQLite + filesystem broker) and explain it.
demo: $(INSTALLED)
	$(BIN)/python -m demo_project.run_demo

## Every test: unit (fake clock) and integration (real brokers, PostgreSQL, worker processes).
test: $(INSTALLED)
	$(BIN)/python -m pytest

# The unit tests keep to one process (-n 0): they use the CPU, not waits, and take seconds.
# The repository's own tests (tests/repository) go with the level their marks say.
REPOSITORY_UNIT := tests/repository -m "not integration"
test-unit: $(INSTALLED)
	$(BIN)/python -m pytest -n 0 tests/unit $(REPOSITORY_UNIT)

test-integration: $(INSTALLED)
	$(BIN)/python -m pytest tests/integration tests/repository -m integration

## The parsers' fuzz tier: DEADLINES_FUZZ_EXAMPLES per property (10,000 unless set; make
## test runs 250), one process, about 5 minutes. The last lines are the summary.
DEADLINES_FUZZ_EXAMPLES ?= 10000
fuzz: $(INSTALLED)
	DEADLINES_FUZZ_EXAMPLES=$(DEADLINES_FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 0 tests/unit/rules/test_fuzz_parsers.py

# Playwright's Python client only (it downloads no browser: Debian's chromium drives it).
CHROMIUM := /usr/bin/chromium
define browser_ready
	$(BIN)/python -m pip install --quiet playwright
	@test -x $(CHROMIUM) || { echo "needs Debian's chromium: apt-get install -y chromium"; exit 1; }
endef

## The operator's console in headless Chromium (tests/browser): find a run by its short id,
## open it, resolve its UNKNOWN charge with evidence, see the caller's result; the lists
## fit 1366 px. Opt-in (about 2 minutes, the demo first: beyond CI's budget).
browser: $(INSTALLED)
	$(browser_ready)
	DEADLINES_BROWSER=1 $(BIN)/python -m pytest -n 0 tests/browser

## The admin's pictures in docs/images/, taken along the same path (tools/screenshots.py).
screenshots: $(INSTALLED)
	$(browser_ready)
	$(BIN)/python tools/screenshots.py

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## The documentation site in docs/_build/html (Sphinx; open index.html): every warning
## is an error, a public name without a reference entry too (docs/_ext/public_surface.py).
docs: $(INSTALLED)
	rm -rf docs/_build
	$(BIN)/sphinx-build -b html -W --keep-going -q -j auto docs docs/_build/html

## The sdist and the wheel in dist/, checked: twine's metadata and README check, then
## what each carries (the wheel: the package and LICENSE; the sdist: the tests too).
dist: $(INSTALLED)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python .ci/check_dist.py dist

## Publish cost and end-to-end throughput, DeadlineTask vs plain Celery (needs Redis).
bench: $(INSTALLED)
	$(BIN)/python bench/overhead.py

## The run ledger vs django-celery-results, and racing claims (needs Redis and PostgreSQL).
bench-ledger: $(INSTALLED)
	$(BIN)/python bench/ledger.py

## On-time work under overload: plain Celery, expires, DeadlineTask on both tiers (Redis,
## PostgreSQL): open-loop arrivals at 0.5x to 3x a prefork worker's capacity and a burst.
bench-overload: $(INSTALLED)
	$(BIN)/python bench/overload.py

## Every benchmark at a smoke size (seconds each, no figure judged): a change that breaks
## one is seen when it lands (.ci/run runs it). Needs Redis and PostgreSQL; the
## instruction counts run without valgrind (BENCH_SMOKE=1, bench/callgrind.py).
bench-smoke: export BENCH_SMOKE = 1
bench-smoke: $(INSTALLED)
	$(BIN)/python bench/overload.py --smoke
	$(BIN)/python bench/overhead.py --tasks 40 --rounds 1 --calls 40
	$(BIN)/python bench/refusal_cost.py --messages 50 --samples 1
	$(BIN)/python bench/ledger.py --tasks 20 --rounds 1 --counted 5 --claims 40 \
	  --claim-rounds 1 --lost-batch 10 --races 1 --scale-small 10000 --scale 10000 \
	  --samples 2 --page-samples 1
	$(BIN)/python bench/retention.py --runs 2000 --batches 3 --middle 2
	$(BIN)/python bench/publish_instructions.py --calls 10
	$(BIN)/python bench/worker_instructions.py --messages 10
	$(BIN)/python bench/worker_memory.py --tasks 50 --rounds 1
	$(BIN)/python bench/worker_main_callgrind.py --tasks 10 --rounds 1

## Unit and Django tests on another interpreter, the newest Django, the oldest Celery.
MATRIX_VENV := .venv-$(notdir $(PYTHON))
#: The newest Django: django-celery-beat caps it (Django<6.1), so the other interpreters
#: run without it (its tests, tests/django/contrib/test_django_celery_beat.py, skip
#: there; the main interpreter runs them).
define newest_django
	$(MATRIX_VENV)/bin/python -m pip uninstall --quiet --yes django-celery-beat
	$(MATRIX_VENV)/bin/python -m pip install --quiet --upgrade django
endef
# Each environment is prepared once (a marker file): CI prepares them in the background
# (matrix-env, matrix-unit-env) while it installs, lints and builds.
$(MATRIX_VENV)/.matrix: pyproject.toml
	$(MAKE) --no-print-directory VENV=$(MATRIX_VENV) PYTHON=$(PYTHON) $(MATRIX_VENV)/.installed
	$(MATRIX_VENV)/bin/python -m pip install --quiet 'celery==5.5.*'
	$(newest_django)
	touch $@

$(MATRIX_VENV)/.matrix-unit: pyproject.toml
	$(MAKE) --no-print-directory VENV=$(MATRIX_VENV) PYTHON=$(PYTHON) $(MATRIX_VENV)/.installed
	$(MATRIX_VENV)/bin/python -m pip install --quiet 'celery==5.6.*'
	$(newest_django)
	touch $@

matrix-env: $(MATRIX_VENV)/.matrix
matrix-unit-env: $(MATRIX_VENV)/.matrix-unit

matrix: $(MATRIX_VENV)/.matrix
	$(MATRIX_VENV)/bin/python -c 'import celery, django; print("celery", celery.__version__, "django", django.__version__)'
	$(MATRIX_VENV)/bin/python -m pytest tests/unit tests/django $(REPOSITORY_UNIT)

## Celery's own task, trace and canvas tests (from the installed release's sdist), run with
## celery.Task and with DeadlineTask as the default task class; fails on any difference.
celery-compat: $(INSTALLED)
	$(BIN)/python compat/celery_compat.py

## django-celery-beat's own scheduler tests (from the installed release's sdist), run with
## its DatabaseScheduler and with DatabaseDeadlineScheduler in its place; fails on any
## difference (about 2 minutes: its tests sleep).
beat-compat: $(INSTALLED)
	$(BIN)/python -m compat.beat_compat

## Celery's own integration tests (canvas, tasks) with DeadlineTask as the default task
## class and deadlines_default_budget = 300, against celery.Task, each on a redis-server of
## its own (opt-in, about 20 minutes: not in .ci/run; BUDGET=none runs it without a budget).
BUDGET ?= 300
celery-integration: $(INSTALLED)
	$(BIN)/python -m compat.celery_integration --budget $(BUDGET)

## The unit tests on another interpreter (CI runs them on Python 3.12, so that every
## Python version the package claims is tested; the matrix above runs the newest).
matrix-unit: $(MATRIX_VENV)/.matrix-unit
	$(MATRIX_VENV)/bin/python -m pytest -n 0 tests/unit $(REPOSITORY_UNIT)

## The configuration matrix (tests/matrix): one scenario on a real worker in each
## configuration projects run, and the pools' enforcement table of
## docs/explanation/pools.md checked against what each worker did. The Celery 5.7 rows run
## in .venv, the 5.5 row in .venv-python3.13 (make matrix-env) and the 5.6 row in
## .venv-python3.12 (make matrix-unit-env): three sessions side by side, each one process
## running its rows side by side (MATRIX_SLOTS at a time, 5 by default); each session's
## output, with its rows' timelines, is printed after it ends, and its workers' logs are
## kept in the folder the last line names. 35 to 50 s on the 2-core machine.
## MATRIX_AWAITING=run also runs the checks awaiting a fix (tests/matrix/rows.py,
## AWAITING_FIXES).
MATRIX_PY313 ?= $(firstword $(wildcard /root/.pyenv/versions/3.13*/bin/python3.13) python3.13)
MATRIX_PY312 ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12) python3.12)
MATRIX_DB ?= test_celery_deadlines_matrix
MATRIX_ARGS ?=
matrix-configs: $(INSTALLED)
	@test -x .venv-python3.13/bin/python || $(MAKE) --no-print-directory PYTHON=$(MATRIX_PY313) matrix-env
	@test -x .venv-python3.12/bin/python || $(MAKE) --no-print-directory PYTHON=$(MATRIX_PY312) matrix-unit-env
	@logs=$$(mktemp -d); started=$$(date +%s); pids=""; \
	for entry in "$(BIN)/python:57" ".venv-python3.13/bin/python:55" ".venv-python3.12/bin/python:56"; do \
	  python=$${entry%%:*}; release=$${entry#*:}; \
	  DEADLINES_MATRIX=1 TEST_POSTGRES_DB=$(MATRIX_DB)_$$release $$python -m pytest -n 0 \
	    -p no:cacheprovider --basetemp=$$logs/$$release --ds=tests.matrix.config.settings.production \
	    tests/matrix $(MATRIX_ARGS) \
	    >$$logs/$$release.log 2>&1 & pids="$$pids $$!:$$release"; \
	done; status=0; \
	for entry in $$pids; do \
	  wait $${entry%%:*} || status=1; echo "== the matrix on Celery $${entry#*:} =="; cat $$logs/$${entry#*:}.log; \
	done; echo "the configuration matrix took $$(( $$(date +%s) - started )) s (its workers' logs: $$logs)"; \
	exit $$status

clean:
	rm -rf $(VENV) .venv-* dist docs/_build demo_project/var .mypy_cache .ruff_cache .pytest_cache .celery-compat

## The nemesis soak's CI tier (tests/chaos/soak.py): >= 300 runs, >= 100 faults, its own
## Redis servers (ports 6390-6399) and database (chaos_ci_*). The last line is the summary.
## CHAOS_SEED=n replays a seed.
chaos: $(INSTALLED)
	$(BIN)/python -m tests.chaos.soak --tier ci

## The soak tier: >= 4,000 runs and >= 1,000 faults, each kind >= 100 times (~40 min).
chaos-soak: $(INSTALLED)
	$(BIN)/python -m tests.chaos.soak --tier soak

## The same workload on RabbitMQ: a node of its own (ports 5680-5689, never the shared
## one on 5672), restarted with its data kept and lost (~6 min; not in CI).
chaos-rabbitmq: $(INSTALLED)
	$(BIN)/python -m tests.chaos.soak --tier rabbitmq
