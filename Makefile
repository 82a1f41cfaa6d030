# pyflink-ndb: `make demo` runs the main job, `make test` runs the tests.
# Both create the virtualenv, install the package and build the bridge jar when missing.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
JAR := pyflink_ndb/jars/pyflink-ndb-bridge.jar
JAVA_SOURCES := $(wildcard java-bridge/src/main/java/io/pyflinkndb/bridge/*.java)
URL ?= sqlite:///var/flight-delays.sqlite
NAMESPACE ?= flights
PYTEST_ARGS ?=
DEMO_ARGS ?=
export PYFLINK_NDB_TEST_MYSQL_URL ?= mysql://root@127.0.0.1:3306/test
# Thread mode wants the virtualenv's interpreter first on PATH (see README, "Thread mode").
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv jar db demo test test-py310 lint clean bench cluster-up cluster-down cluster-demo

venv: $(VENV)/.installed

# The build requirements of pyproject.toml go in first, so that the editable build (setup.py
# compiles the bridge jar into the tree when a JDK is there) needs no second environment.
$(VENV)/.installed: pyproject.toml setup.py
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet 'setuptools>=77' wheel 'apache-flink==1.20.*'
	$(PY) -m pip install --quiet --no-build-isolation -e '.[dev]'
	touch $@

jar: $(JAR)

$(JAR): $(JAVA_SOURCES) java-bridge/build.sh | $(VENV)/.installed
	bash java-bridge/build.sh $(PY) $(JAR)

db:
	bash scripts/ensure-mysql.sh "$(PYFLINK_NDB_TEST_MYSQL_URL)"

demo: venv jar
	PYTHONWARNINGS="ignore:pkg_resources is deprecated:UserWarning" \
	  $(PY) jobs/flight_delays.py --url "$(URL)" --namespace "$(NAMESPACE)" $(DEMO_ARGS)

test: venv jar db
	$(PY) -m pytest $(PYTEST_ARGS)

# The second Python version CI tests (README, "Install from a wheel"): the unit, store and
# README-example tests under Python 3.10 in var/venv310 (the Flink MiniCluster suite runs
# under 3.11 only, to keep CI short).
PY310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python /usr/bin/python3.10 /usr/local/bin/python3.10))
VENV310 := var/venv310

test-py310: jar db
	@test -n "$(PY310)" || { echo "error: no Python 3.10 on this machine (set PY310=/path/to/python3.10)"; exit 1; }
	test -x $(VENV310)/bin/python || $(PY310) -m venv $(VENV310)
	$(VENV310)/bin/python -m pip install --quiet --upgrade pip
	$(VENV310)/bin/python -m pip install --quiet 'setuptools>=77' wheel 'apache-flink==1.20.*'
	$(VENV310)/bin/python -m pip install --quiet --no-build-isolation -e '.[dev]'
	PATH=$(CURDIR)/$(VENV310)/bin:$$PATH $(VENV310)/bin/python -m pytest -m "not flink" $(PYTEST_ARGS)
	PATH=$(CURDIR)/$(VENV310)/bin:$$PATH $(VENV310)/bin/python -m pytest tests/test_readme.py $(PYTEST_ARGS)

# A local standalone Flink cluster from the apache-flink wheel (see README, "Run on a local
# cluster"); `cluster-demo` submits the flight-delays job to it with `flink run` (state in
# the MySQL-protocol server) and prints the committed-state summary.
CLUSTER_URL ?= $(PYFLINK_NDB_TEST_MYSQL_URL)
CLUSTER_NAMESPACE ?= flights_cluster
CLUSTER_JOB_ARGS ?=

cluster-up: venv jar
	bash scripts/cluster.sh up

cluster-down:
	bash scripts/cluster.sh down

cluster-demo: venv jar db
	bash scripts/cluster.sh status >/dev/null || bash scripts/cluster.sh up
	bash scripts/cluster.sh flink run -py jobs/flight_delays.py --url "$(CLUSTER_URL)" \
		--namespace "$(CLUSTER_NAMESPACE)" $(CLUSTER_JOB_ARGS)

# A benchmark, not a test: about 85 minutes (QUICK=1: a few minutes); see README, "Benchmarks".
bench: venv jar db
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	PYTHONWARNINGS="ignore:pkg_resources is deprecated:UserWarning" \
	  $(PY) -m bench.run $(if $(QUICK),--quick) $(BENCH_ARGS) --mysql-url "$(PYFLINK_NDB_TEST_MYSQL_URL)"

# Fault injection, the long variant: 200+ faults (crashes inside the protocol, bad records,
# database kills, outages of 10 s and 60 s, locks and deadlocks, TaskManager kill -9 and
# zombies on a two-TaskManager cluster, JobManager kill -9 with ZooKeeper HA, rescale
# 2→3→1); about 30 minutes here. Writes
# tests/faults/results.md (see README, "Fault injection"). Not part of `make test`, which
# runs the quick variant (tests/test_faults.py).
faults: venv jar db
	$(PY) -m tests.faults --variant long --out tests/faults/results.md $(FAULTS_ARGS)

lint: venv
	$(VENV)/bin/ruff check pyflink_ndb tests jobs bench setup.py
	$(VENV)/bin/mypy pyflink_ndb

clean:
	rm -rf build dist var $(JAR) .pytest_cache .mypy_cache .ruff_cache
