# vcloud on Slurm: the two commands a newcomer needs are `make demo` and `make test`.
# Runs as root on Debian 12 (the local cluster installs Debian packages and starts daemons).

SHELL := /bin/bash
.DEFAULT_GOAL := help

# Debian's interpreter, so the cluster user can read the venv (a pyenv under /root is private).
PYTHON ?= /usr/bin/python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.lock.sha256
# The Slurm provider distribution, installed editable into the venv.
PROVIDER := providers/slurm
PROVIDER_STAMP := $(VENV)/.provider.sha256
CLUSTER := include/local_cluster/cluster.sh
CLUSTER_DIR ?= /var/lib/vcloud-localcluster
PYTEST_ARGS ?=
# Slurm tests mostly wait on the cluster, so more workers than cores pays off.
# --dist loadgroup: a module that shares one Airflow deployment (xdist_group) runs on one worker;
# --no-loadscope-reorder: work is handed out in the order conftest.py sorts it (not by group size).
# --durations: the slowest tests are named at the end of every run.
TEST_WORKERS ?= 4
# make demo PROFILE=lumi|levante|cosmos: that site's own job scripts on the local cluster.
PROFILE ?= local

.PHONY: help venv system-packages packages bringup cluster-up cluster-down cluster-status image typecheck test test-fast demo lock clean

help:
	@echo "make demo          run the training DAG end to end on the local Slurm cluster (tiny config)"
	@echo "make test          bring up the local cluster if needed, run every test and type-check beside them"
	@echo "make cluster-up    start the local Slurm cluster and its SSH login node (idempotent)"
	@echo "make cluster-down  stop the daemons cluster-up started"
	@echo "make image         build the local cluster's trainer image (Charliecloud) if missing or stale"
	@echo "make venv          create .venv from requirements-lock.txt, with the Slurm provider (editable)"
	@echo "make bringup       venv, cluster-up and image at once (make demo and make test start with it)"

system-packages:
	@if ! $(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then \
	  echo "installing python3-venv"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; \
	fi

# Rebuilt when requirements-lock.txt changes; the Slurm provider (editable) is reinstalled when its
# pyproject.toml changes (entry points and dependencies live there), replacing an install under the
# distribution's former name (airflow-provider-slurm, a name PyPI gives to another project).
venv: system-packages
	@want=$$(sha256sum requirements-lock.txt | cut -d' ' -f1); \
	if [ -x $(VENV_PY) ] && [ "$$(cat $(VENV_STAMP) 2>/dev/null)" = "$$want" ]; then exit 0; fi; \
	echo "creating $(VENV) from requirements-lock.txt"; \
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && \
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-lock.txt 2>&1 | grep -v '^WARNING: Location' ; \
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e trainer 2>&1 | grep -v '^WARNING: Location' ; \
	$(VENV_PY) -c 'import airflow, torch, rasterio, tifffile, vcloud' && echo "$$want" > $(VENV_STAMP)
	@want=$$(sha256sum $(PROVIDER)/pyproject.toml | cut -d' ' -f1); \
	if [ "$$(cat $(PROVIDER_STAMP) 2>/dev/null)" = "$$want" ]; then exit 0; fi; \
	echo "installing $(PROVIDER) (editable) into $(VENV)"; \
	$(VENV)/bin/pip uninstall -q -y airflow-provider-slurm >/dev/null 2>&1; \
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e $(PROVIDER) 2>&1 \
	  | grep -v '^WARNING: Location' ; \
	$(VENV_PY) -c 'import slurm_provider.get_provider_info' && echo "$$want" > $(PROVIDER_STAMP)

cluster-up:
	@bash $(CLUSTER) up

cluster-down:
	@bash $(CLUSTER) down

cluster-status:
	@bash $(CLUSTER) status

# The jobs' container image on the local cluster; rebuilt only when trainer/requirements-runtime.txt
# or the build script change (the script compares its build hash).
image:
	@bash include/local_cluster/build_image.sh
	@bash include/local_cluster/site_images.sh

# mypy over the Slurm provider, the plugins, the trainer and the DAG file, as configured in pyproject.toml.
typecheck: venv
	$(VENV_PY) -m mypy

# Every Debian package the bring-up needs, installed one step after another (apt and dpkg each
# hold one lock), so that the steps below can then run at once.
packages: system-packages
	@bash $(CLUSTER) packages
	@bash include/local_cluster/build_image.sh packages

# The project's venv, the local cluster and the jobs' image do not depend on each other: built at
# once (on a machine that never ran them, mostly downloads and unpacking), the first bring-up takes
# about as long as its longest step instead of the sum of all three.
bringup: packages
	@$(MAKE) --no-print-directory -j3 venv cluster-up image

# mypy checks beside the tests instead of before them (on two cores that is most of its half
# minute saved); its verdict is printed after theirs and fails `make test` like a failing test.
test: bringup
	@bash include/test_deps.sh
	@typecheck_log=$$(mktemp); \
	$(VENV_PY) -m mypy >"$$typecheck_log" 2>&1 & typecheck=$$!; \
	$(VENV_PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 $(PYTEST_ARGS); \
	rc=$$?; \
	if wait "$$typecheck"; then mypy_rc=0; else mypy_rc=$$?; fi; \
	echo "$(VENV_PY) -m mypy (beside the tests):"; cat "$$typecheck_log"; rm -f "$$typecheck_log"; \
	if [ "$$mypy_rc" -ne 0 ]; then echo "make test: the type check failed (exit $$mypy_rc); make typecheck repeats it"; rc=1; fi; \
	exit $$rc

# Unit tests only (no cluster): quick feedback while editing pure logic.
test-fast: venv
	$(VENV_PY) -m pytest -m "not cluster" $(PYTEST_ARGS)

demo: bringup
	@PROFILE=$(PROFILE) bash include/demo.sh

# Re-resolve the pinned set from requirements.txt (torch stays the on-disk CPU 2.13.0 wheel).
lock: system-packages
	rm -rf /tmp/vcloud-lock-venv && $(PYTHON) -m venv /tmp/vcloud-lock-venv
	/tmp/vcloud-lock-venv/bin/pip install -q torch==2.13.0 -r requirements.txt
	/tmp/vcloud-lock-venv/bin/pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' > requirements-lock.txt
	rm -rf /tmp/vcloud-lock-venv

clean:
	rm -rf $(VENV) .pytest_cache
