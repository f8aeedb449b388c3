# Two commands set everything up (idempotent): `make test` and `make demo`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow demo bench lint clean alfworld-data data wheels

# Benchmark data (README, "Data"): $AGENTJAX_DATA, else ../shared/data beside the project when it is there.
ifeq ($(AGENTJAX_DATA),)
ifneq ($(wildcard ../shared/data),)
export AGENTJAX_DATA := $(abspath ../shared/data)
endif
endif

# ALFWorld games (envs/alfworld): unless ALFWORLD_DATA is set, unpack the archives in $AGENTJAX_DATA/alfworld (default
# ../shared/data/alfworld) once into .data/alfworld (about 3 s) and export ALFWORLD_DATA=.data/alfworld.
ALFWORLD_ARCHIVES ?= $(or $(AGENTJAX_DATA),../shared/data)/alfworld
ifeq ($(ALFWORLD_DATA),)
ifneq ($(wildcard $(ALFWORLD_ARCHIVES)/json_2.1.1_*.tar.xz),)
export ALFWORLD_DATA := $(CURDIR)/.data/alfworld
ALFWORLD_UNPACK := 1
endif
endif

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's metadata changes. torch is pinned (==2.13.0, the CPU build on disk).
# The venv's bin/ leads PATH: the sdists' setup.py files run a bare `python`, which must be the venv's.
$(STAMP): pyproject.toml | $(PY)
	$(MAKE) --no-print-directory wheels
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip install --quiet --no-compile --find-links '$(WHEELS)' -e '.[test]'
	@touch $(STAMP)

# The two sdists among the dependencies, fast-downward-textworld (textworld[pddl]'s planner: 2 min of g++) and jericho
# (textworld's Z-machine interpreter: 30 s of C), build pure-Python wheels: built once, side by side, into WHEELS,
# which the venv above (run by its recipe, so an installed venv never calls pip) and
# .ci/python-version.sh's venvs install from (pip's own cache keys builds by interpreter).
# The versions are pyproject.toml's pins. A wheel already there is only copied.
SDISTS := fast-downward-textworld==20.6.4 jericho==3.3.1
WHEELS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/agentjax/wheels
wheels: | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	@mkdir -p '$(WHEELS)'
	@pids=""; for sdist in $(SDISTS); do \
	  PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip wheel --quiet --no-deps --find-links '$(WHEELS)' \
	    -w '$(WHEELS)' "$$sdist" & pids="$$pids $$!"; \
	done; for pid in $$pids; do wait $$pid || { echo "make: building a wheel of $(SDISTS) failed"; exit 1; }; done

# One pytest worker per core (pytest-xdist), each test file on one worker (its module fixtures built once).
TEST_WORKERS ?= auto
test: $(STAMP) alfworld-data
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

# The end-to-end checks of minutes and the heaviest duplicates (pytest -m slow; README), on the same workers.
# SLOW picks among them (CI: "slow and not multiprocess").
SLOW ?= slow
test-slow: $(STAMP) alfworld-data
	$(PY) -m pytest -m "$(SLOW)" -n $(TEST_WORKERS) --dist loadfile

# A few minutes on 2 cores: GRPO, GiGPO and CRBC from random init on the credit testbed's S2 (small text MDPs with a
# known model), 3 seeds each, a line per evaluation, then the table of each method's exact-success gain ± SE, the
# paired differences and the credit accuracy, the curves in experiments/credit_testbed/runs/demo/ and what it showed
# (experiments/credit_testbed/README.md, "make demo"); a second `make demo` reports the finished runs.
demo: $(STAMP)
	$(PY) experiments/credit_testbed/demo.py

# The benchmarks' extra references (gym-sokoban for experiments/bench/envs.py): the `bench` extra.
$(VENV)/.installed-bench: pyproject.toml $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip install --quiet --find-links '$(WHEELS)' -e '.[test,bench]'
	@touch $@

bench: $(VENV)/.installed-bench alfworld-data
	$(PY) experiments/bench/credit.py
	$(PY) experiments/bench/model.py
	$(PY) experiments/bench/envs.py
	$(PY) experiments/bench/update.py

alfworld-data: | $(PY)
ifdef ALFWORLD_UNPACK
	$(PY) envs/alfworld/prepare_data.py --archives $(ALFWORLD_ARCHIVES) --dest $(ALFWORLD_DATA)
endif

# The benchmark data (envs/data.py): fetch what is missing under $AGENTJAX_DATA (default ../shared/data) from the
# official sources and check every sha256 (README, "Data"). DATA_ARGS="--mirror URL" (a copy of the data folder),
# "--only alfworld webshop", "--verify" (check only), "--dest DIR".
data: $(STAMP)
	$(PY) -m agentjax.cli data $(DATA_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check agentjax envs experiments tests

clean:
	rm -rf $(VENV) .pytest_cache
