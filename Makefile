# The DeepSpeed hands-on course. `make course` and `make test` set everything up on first use.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.course-setup
KERNEL := deepspeed-course
TEST_WORKERS ?= 2

.PHONY: setup wheelhouse ops course test test-gpu gpu-check lab student release grade catchup bench clean help preflight instructors hub hub-stop

help:
	@echo "make preflight  before a workshop: will this machine run the course? (no set-up needed)"
	@echo "make course   set up if needed, run every notebook, write build/report.md"
	@echo "make test     set up if needed, run the unit tests and every notebook (smoke parameters)"
	@echo "make wheelhouse [WHEELHOUSE=build/wheelhouse] [WHEEL_PYTHON=3.12] [WHEEL_PLATFORM=manylinux_2_28_x86_64]"
	@echo "              [WHEEL_EXCLUDE=torch]  wheels for a machine without network (default: this one's Python and"
	@echo "              platform); there, make setup (or course, test) WHEELHOUSE=<folder> installs from them (README)"
	@echo "make ops      build every DeepSpeed op the course loads now (course and lab build those set-up left out"
	@echo "              in the background)"
	@echo "make test-gpu on a machine with an NVIDIA GPU: the GPU figures (CUDA memory, the fp16 engine, offload)"
	@echo "make gpu-check BUDGET=<seconds> [WHEELHOUSE=<folder>] [NB=\"00 04\"] [SMOKE=1] [ARCHIVE=1|<folder>]  a GPU machine at"
	@echo "              hand for minutes: test-gpu, then the notebooks no GPU has run, within the budget; the evidence in"
	@echo "              reference/gpu/<date>-<gpu>/ (WHEELHOUSE: makes .venv without network, keeping the machine's CUDA torch;"
	@echo "              ARCHIVE: also <folder>.tar.gz, beside it or in <folder>; COMMIT=<sha>[-dirty] where the copy has no .git)"
	@echo "make lab      JupyterLab on the course"
	@echo "make student  student edition (solutions removed) in build/student/"
	@echo "make release  [NB=\"00 05\"]  nbgrader's student assignments in build/nbgrader/release/ (one per notebook)"
	@echo "make grade SUBMISSIONS=<folder> [SMOKE=1] [CELL_TIMEOUT=300]  autograde <folder>/<participant>/<notebook>/*.ipynb:"
	@echo "              build/nbgrader/grades.csv, feedback HTML, a summary of what each got and where it stopped"
	@echo "make hub ROSTER=<file> HUB_PASSWORD_FILE=<file> [PORT=8000] [IP=...] [OPEN=1]  (as root) the workshop on this"
	@echo "              server: JupyterHub, a Unix user per participant, nbgrader's exchange (INSTRUCTORS.md)"
	@echo "make hub-stop [REMOVE_USERS=1]  stop the hub, its proxy, every participant's server and launch"
	@echo "make catchup NB=03 [UPTO=3] [COPY=<notebook>]  run a participant's copy (build/student/) down to a section,"
	@echo "              their cells kept; then restore(\"03\") in their kernel brings the variables back"
	@echo "make bench    runner overhead and launch-time benchmarks"
	@echo "make instructors  record the last full make course's times in notebooks/manifest.toml and INSTRUCTORS.md's table"

setup: $(STAMP)

preflight:
	@$(PYTHON) -m course_utils.tooling.preflight

# A folder of wheels for `make setup WHEELHOUSE=<folder>` on machines without network (the compute nodes' Python
# and platform; WHEEL_EXCLUDE: packages they already have). course_utils/tooling/wheelhouse.py says how.
wheelhouse:
	$(PYTHON) -m course_utils.tooling.wheelhouse build "$(or $(WHEELHOUSE),build/wheelhouse)" \
	  $(if $(WHEEL_PYTHON),--python $(WHEEL_PYTHON)) $(if $(WHEEL_PLATFORM),--platform $(WHEEL_PLATFORM)) \
	  $(if $(WHEEL_EXCLUDE),--exclude $(WHEEL_EXCLUDE))

# Each step prints one line (n of N, about how long) and its time; its output goes to build/setup.log.
STEP = $(PY) -m course_utils.kernel.progress step
# WHEELHOUSE=<folder> (made by `make wheelhouse`): the packages come from that folder only, without network.
PIP_SOURCE = $(if $(WHEELHOUSE),--no-index --find-links "$(abspath $(WHEELHOUSE))")

# The system packages (apt) install beside pip: .ci/install-system, NOTE lines where it cannot (not root, no apt).
$(STAMP): requirements.txt pyproject.toml course_utils/kernel/ops.py course_utils/kernel/opbuild.py course_utils/kernel/kernel_main.py .ci/install-system .ci/install-libaio .ci/install-multinode .ci/install-slurm
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(STEP) packages --beside "bash .ci/install-system" -- sh -c '$(if $(WHEELHOUSE),$(PY) -m course_utils.tooling.wheelhouse check "$(WHEELHOUSE)" && )\
	  $(PY) -m pip install -q $(PIP_SOURCE) --upgrade pip && $(PY) -m pip install -q $(PIP_SOURCE) -r requirements.txt \
	  && $(PY) -m pip install -q $(PIP_SOURCE) --no-deps -e .'
	@# ipykernel stages the kernelspec in a folder of its own under TMPDIR and leaves that folder behind: one to remove
	@# the kernel then starts course_utils.kernel.kernel_main, ipykernel's own kernel without the interpreter's teardown
	@$(STEP) kernel -- sh -c 'tmp=$$(mktemp -d) && TMPDIR=$$tmp $(PY) -m ipykernel install --sys-prefix --name $(KERNEL) \
	  --display-name "DeepSpeed course (.venv)"; status=$$?; rm -rf "$$tmp"; \
	  test $$status -eq 0 && $(PY) -m course_utils.kernel.kernel_main --install $(KERNEL)'
	@$(STEP) ops --show -- $(PY) -m course_utils.kernel.opbuild --build --first
	@touch $(STAMP)

# Every DeepSpeed op the course uses (set-up builds only the first notebooks'; `make course` and `make lab` build
# the rest in the background, and a launch waits for an op it loads).
ops: setup
	@$(PY) -m course_utils.kernel.opbuild --build

course: setup
	$(PY) -m course_utils.tooling.course run

test: ops
	$(PY) -m pytest -n $(TEST_WORKERS) --maxschedchunk 1

test-gpu: ops
	$(PY) -m pytest -m gpu -p no:xdist

# No set-up first: it starts under the machine's own python3 (its CUDA torch) and makes .venv from WHEELHOUSE only when
# the course's packages are missing there (course_utils/tooling/gpu_check.py).
GPU_PYTHON ?= python3
gpu-check:
	@test -n "$(BUDGET)" || { echo "usage: make gpu-check BUDGET=<seconds> [WHEELHOUSE=<folder>] [NB=\"00 04\"] [SMOKE=1] [ARCHIVE=1|<folder>] [COMMIT=<sha>]"; exit 2; }
	$(GPU_PYTHON) -m course_utils.tooling.gpu_check --budget $(BUDGET) $(if $(WHEELHOUSE),--wheelhouse "$(WHEELHOUSE)") \
	  $(if $(NB),--only $(NB)) $(if $(filter 1,$(SMOKE)),--smoke) $(if $(filter 1,$(ARCHIVE)),--archive,$(if $(ARCHIVE),--archive "$(ARCHIVE)")) \
	  $(if $(COMMIT),--commit $(COMMIT))

lab: setup
	$(PY) -m course_utils.kernel.opbuild --background $(VENV)/bin/jupyter lab notebooks/ --KernelManager.transport_encryption=auto

student: setup
	$(PY) -m course_utils.tooling.student

release: setup
	$(PY) -m course_utils.tooling.workshop release $(if $(NB),--only $(NB))

grade: ops
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<folder>/<participant>/<notebook>/<notebook>.ipynb [SMOKE=1]"; exit 2; }
	$(PY) -m course_utils.tooling.workshop grade "$(SUBMISSIONS)" $(if $(filter 1,$(SMOKE)),--smoke) $(if $(CELL_TIMEOUT),--timeout $(CELL_TIMEOUT))

catchup: ops
	@test -n "$(NB)" || { echo "usage: make catchup NB=03 [UPTO=3] [COPY=<your notebook>]"; exit 2; }
	$(PY) -m course_utils.tooling.catchup $(NB) $(if $(UPTO),--upto "$(UPTO)") $(if $(COPY),--copy "$(COPY)")

# The workshop server (course_utils/tooling/workshop/hub.py): run as root; everything it writes is under build/hub/.
hub: ops
	@test -n "$(ROSTER)" || { echo "usage: sudo make hub ROSTER=<one user name a line> HUB_PASSWORD_FILE=<file> [PORT=8000]"\
	  "[IP=127.0.0.1] [INSTRUCTOR=instructor] [IDLE=3600] [OPEN=1] [FORCE=1]"; exit 2; }
	$(PY) -m course_utils.tooling.workshop.hub start --roster "$(ROSTER)" $(if $(HUB_PASSWORD_FILE),--password-file "$(HUB_PASSWORD_FILE)") \
	  $(if $(PORT),--port $(PORT)) $(if $(IP),--ip $(IP)) $(if $(INSTRUCTOR),--instructor $(INSTRUCTOR)) \
	  $(if $(IDLE),--idle-timeout $(IDLE)) $(if $(filter 1,$(OPEN)),--open-paths) $(if $(filter 1,$(FORCE)),--force)

hub-stop:
	$(PY) -m course_utils.tooling.workshop.hub stop $(if $(filter 1,$(REMOVE_USERS)),--remove-users)

instructors: setup
	$(PY) -m course_utils.tooling.instructors

bench: ops
	$(PY) bench/bench_launch.py $(BENCH_ARGS)

clean:
	rm -rf build
