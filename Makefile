# The DeepSpeed hands-on course. `make course` and `make test` set everything up on first use.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-setup
KERNEL := deepspeed-course
TEST_WORKERS ?= 2

.PHONY: setup course test test-gpu lab student release grade catchup bench clean help preflight

help:
	@echo "make preflight  before a workshop: will this machine run the course? (no set-up needed)"
	@echo "make course   set up if needed, run every notebook, write build/report.md"
	@echo "make test     set up if needed, run the unit tests and every notebook (smoke parameters)"
	@echo "make test-gpu on a machine with an NVIDIA GPU: the GPU figures (CUDA memory, the fp16 engine, offload)"
	@echo "make lab      JupyterLab on the course"
	@echo "make student  student edition (solutions removed) in build/student/"
	@echo "make release  [NB=\"00 05\"]  nbgrader's student assignments in build/nbgrader/release/ (one per notebook)"
	@echo "make grade SUBMISSIONS=<folder> [SMOKE=1] [CELL_TIMEOUT=300]  autograde <folder>/<participant>/<notebook>/*.ipynb:"
	@echo "              build/nbgrader/grades.csv, feedback HTML, a summary of what each got and where it stopped"
	@echo "make catchup NB=03 [UPTO=3] [COPY=<notebook>]  run a participant's copy (build/student/) down to a section,"
	@echo "              their cells kept; then restore(\"03\") in their kernel brings the variables back"
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

test-gpu: setup
	$(PY) -m pytest -m gpu -p no:xdist

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

student: setup
	$(PY) -m course_utils.student

release: setup
	$(PY) -m course_utils.workshop release $(if $(NB),--only $(NB))

grade: setup
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<folder>/<participant>/<notebook>/<notebook>.ipynb [SMOKE=1]"; exit 2; }
	$(PY) -m course_utils.workshop grade "$(SUBMISSIONS)" $(if $(filter 1,$(SMOKE)),--smoke) $(if $(CELL_TIMEOUT),--timeout $(CELL_TIMEOUT))

catchup: setup
	@test -n "$(NB)" || { echo "usage: make catchup NB=03 [UPTO=3] [COPY=<your notebook>]"; exit 2; }
	$(PY) -m course_utils.catchup $(NB) $(if $(UPTO),--upto "$(UPTO)") $(if $(COPY),--copy "$(COPY)")

bench: setup
	$(PY) bench/bench_launch.py $(BENCH_ARGS)

clean:
	rm -rf build
