# jobscope: every entry point. `make up` and `make test` install what is missing first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum requirements.txt | cut -c1-12)
BENCH_STAMP := $(VENV)/.bench-installed-$(shell sha256sum bench/requirements.txt 2>/dev/null | cut -c1-12)
# Superset's own venv (never the server's): its pins would clash with the server's.
SUPERSET_VENV := .venv-superset
SUPERSET_STAMP := $(SUPERSET_VENV)/.installed-$(shell sha256sum superset/requirements.txt | cut -c1-12)
PYTEST_ARGS ?=
# `make test`'s pytest-xdist workers, each with a test stack of its own (tests/scheduling.py).
TEST_WORKERS ?= 4
QUICK ?=
ONLY ?=
# `make bench SCALE=1`: the scale profile (bench/scale.py): a day, then a week, of a fleet;
# SCALE_DEVICES (default 100) and SCALE_DAYS (default 1,7) choose another fleet or levels.
SCALE ?=
SCALE_DEVICES ?=
SCALE_DAYS ?=
SCALE_ARGS := $(if $(SCALE),--scale $(if $(SCALE_DEVICES),--scale-devices $(SCALE_DEVICES),) \
  $(if $(SCALE_DAYS),--scale-days $(SCALE_DAYS),),)
# `make up DEVICES=sample`: every plugin's sample against simulated devices it starts;
# `make up DEVICES=path`: a devices file or directory (e.g. Kwollect's metrics.d); default: demo.
DEVICES ?=
# `make up JSON_TOPIC=1`: the producers and the API also write every reading as JSON lines to
# topic readings-json (JSON_TOPIC=name: to that topic); unset: no JSON copy.
JSON_TOPIC ?=
JSON_ENV := $(if $(filter 1,$(JSON_TOPIC)),JOBSCOPE_JSON_TOPIC=readings-json,$(if $(JSON_TOPIC),JOBSCOPE_JSON_TOPIC=$(JSON_TOPIC),))
# `make up KAFKA_SASL=false`: a Kafka broker that lets every local account in (SASL/SCRAM
# with a user per component otherwise: stack/kafka_broker.py). A new state gets SASL; an
# existing one keeps the mode it was started with unless KAFKA_SASL is given.
KAFKA_SASL ?= $(if $(wildcard $(CURDIR)/state/kafka/data/meta.properties),,true)
KAFKA_ENV := $(if $(KAFKA_SASL),JOBSCOPE_KAFKA_SASL=$(KAFKA_SASL),)
# `make up AUTH=oidc`: also a local OpenID Connect provider (Keycloak) with demo users, the API
# trusting it under the `jobs` read policy; READ_POLICY=open|authenticated|jobs chooses another.
AUTH ?=
READ_POLICY ?= $(if $(filter oidc,$(AUTH)),jobs,)
AUTH_ENV := $(if $(AUTH),JOBSCOPE_AUTH=$(AUTH),) $(if $(READ_POLICY),JOBSCOPE_READ_POLICY=$(READ_POLICY),)
DEVICES_ENV := $(if $(filter sample,$(DEVICES)),JOBSCOPE_DEVICES_FILE=$(CURDIR)/producers/config/sample JOBSCOPE_SIMULATORS=true,$(if $(DEVICES),JOBSCOPE_DEVICES_FILE=$(abspath $(DEVICES)),))

.PHONY: oidc-provider help up down install uninstall status connect test test-fast lint format bench system-deps venv reset backup restore superset superset-venv helm-tools test-helm otelcol

help:
	@echo "make up        start Kafka, ClickHouse, producers (demo fleet) and the API"
	@echo "               DEVICES=sample: SNMP + IPMI samples on simulated devices; DEVICES=path: yours"
	@echo "               JSON_TOPIC=1: also every reading as JSON on topic readings-json"
	@echo "               AUTH=oidc: a local OpenID Connect provider with demo users (jobscope login)"
	@echo "make superset  Superset dashboards on 127.0.0.1:8088 against the running stack"
	@echo "make connect   Kafka Connect beside the running stack: OAR jobs by change data capture"
	@echo "make down      stop them (data kept in state/)"
	@echo "make install   as root: install jobscope as systemd units (jobscope.target); WITH=superset,connect: those too"
	@echo "make status    what runs, where it listens, where it logs"
	@echo "make backup DIR=path [FROM=prev]  a consistent backup of the running stack (FROM: incremental)"
	@echo "make restore DIR=path  restore a backup into a fresh state/ (the stack stopped)"
	@echo "make test      the whole test suite against real components"
	@echo "make bench     benchmarks beside peers (QUICK=1 short run; ONLY=api|freshness|drain|snmp|...|live|abuse: one part; SCALE=1: a day and a week)"
	@echo "make lint      ruff"
	@echo "make reset     stop everything and delete state/ (all data)"

# Debian packages: Java and Maven (Kafka), snmpd, openipmi, freeipmi-tools (see the script).
system-deps:
	@sh stack/install-system-deps.sh

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "Python >= 3.11 is required"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-compile --no-deps -e .
	@# byte-code on every core (pip compiles on one): the engine's account cannot write it later
	@$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

up: system-deps venv
	$(DEVICES_ENV) $(JSON_ENV) $(KAFKA_ENV) $(AUTH_ENV) $(PY) -m stack up

down:
	@if [ -x $(PY) ]; then $(PY) -m stack down; else echo "nothing to stop"; fi

# jobscope as systemd units on this machine, run from this checkout (stack/install.py,
# docs/operations.md): settings in /etc/jobscope/jobscope.env, state in /var/lib/jobscope.
install: system-deps venv $(if $(findstring superset,$(WITH)),superset-venv)
	$(PY) -m stack install $(if $(WITH),--with $(WITH))

uninstall:
	$(PY) -m stack uninstall

status: venv
	$(DEVICES_ENV) $(PY) -m stack status

# The three installs run side by side (each waits mostly on one core or on the network).
test: system-deps
	@$(MAKE) --no-print-directory -j 3 -O venv superset-venv helm-tools oidc-provider otelcol
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# Keycloak (the tests' OpenID Connect provider, and `make up AUTH=oidc`'s): resolved by Maven,
# built once into the user's cache directory (stack/oidc_provider.py).
oidc-provider: venv
	@$(PY) -m stack.oidc_provider

# Kafka Connect beside the stack `make up` started (a local OAR database unless
# JOBSCOPE_CONNECT_LOCAL_OAR_DB=false), its connectors (connectors/*.json) registered;
# `make down` stops them with the stack.
connect: system-deps venv
	$(PY) -m connectors up

# The chart tests' tools (helm, kube-apiserver, etcd built with Go; .venv-helm), cached by version.
helm-tools:
	@bash helm/install-tools.sh

test-helm: venv helm-tools
	$(PY) -m pytest tests/helm $(PYTEST_ARGS)

# The OpenTelemetry Collector the OTLP tests send through (tests/otelcol/: ocb's sources, built
# with Go into the same cache as the chart's tools, by release).
otelcol:
	@bash tests/otelcol/install.sh

test-fast: venv otelcol
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

$(BENCH_STAMP): bench/requirements.txt $(STAMP)
	bash bench/install-peers.sh
	$(PY) -m pip install -q --disable-pip-version-check -r bench/requirements.txt
	@rm -f $(VENV)/.bench-installed-* && touch $@

bench: system-deps venv $(BENCH_STAMP)
	$(PY) -m bench $(if $(QUICK),--quick,) $(if $(ONLY),--only $(ONLY),) $(SCALE_ARGS)

$(SUPERSET_STAMP): superset/requirements.txt
	@test -x $(SUPERSET_VENV)/bin/python || $(PYTHON) -m venv $(SUPERSET_VENV)
	@# no byte-code now: Superset's processes write what they import (most of it they never do)
	$(SUPERSET_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-compile \
	  -r superset/requirements.txt
	@rm -f $(SUPERSET_VENV)/.installed-* && touch $@

superset-venv: $(SUPERSET_STAMP)

# Superset against the stack `make up` started: initialise, import the dashboards, serve.
superset: system-deps venv superset-venv
	$(PY) -m stack superset

reset: down
	rm -rf state

# docs/operations.md, "Backup and restore".
backup: venv
	@test -n "$(DIR)" || { echo "usage: make backup DIR=path [FROM=previous backup]"; exit 2; }
	$(DEVICES_ENV) $(PY) -m stack backup "$(DIR)" $(if $(FROM),--incremental-from "$(FROM)")

restore: venv
	@test -n "$(DIR)" || { echo "usage: make restore DIR=path"; exit 2; }
	$(DEVICES_ENV) $(PY) -m stack restore "$(DIR)"
