# The DeepSpeed hands-on course. `make course` and `make test` set everything up on first use.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-setup
KERNEL := deepspeed-course
TEST_WORKERS ?= 2

.PHONY: setup course test lab student bench clean help preflight

help:
	@echo "make preflight  before a workshop: will this machine run the course? (no set-up needed)"
	@echo "make course   set up if needed, run every notebook, write build/report.md"
	@echo "make test     set up if needed, run the unit tests and every notebook (smoke parameters)"
	@echo "make lab      JupyterLab on the course"
	@echo "make student  student edition (solutions removed) in build/student/"
	@echo "make bench    runner overhead and launch-time benchmarks"

setup: $(STAMP)

preflight:
	@$(PYTHON) -m course_utils.preflight

$(STAMP): requirements.txt pyproject.toml course_utils/ops.py .ci/install-libaio .ci/install-multinode
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "DeepSpeed course (.venv)" >/dev/null
	bash .ci/install-libaio
	bash .ci/install-multinode
	$(PY) -m course_utils.ops --build
	@touch $(STAMP)

course: setup
	$(PY) -m course_utils.course run

test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --maxschedchunk 1

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

student: setup
	$(PY) -m course_utils.student

bench: setup
	$(PY) bench/bench_launch.py $(BENCH_ARGS)

clean:
	rm -rf build
