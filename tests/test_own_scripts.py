"""A learner's own script outside the course: launched with the plain `deepspeed` CLI, without the runner and its
rank hook, it must end cleanly by itself, and the clean-up line that scripts/trainer_template.py documents must
remove what DeepSpeed leaves in /dev/shm (the runner does both for the course's launches)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from glob import glob
from pathlib import Path

import pytest

from course_utils.common import paths, reaper
from course_utils.kernel import hardware
from course_utils.kernel.launch import commands, environment, processes

SCRIPTS = Path(__file__).parent / "scripts"
TEMPLATE = paths.ROOT / "scripts" / "trainer_template.py"
DEFAULT_PORT = "29500"      # the deepspeed CLI's --master_port default (deepspeed/constants.py), in the documented line


def documented_cleanup(port: int) -> str:
    """The template docstring's shell line that removes a launch's /dev/shm buffers, for ``port``."""
    doc = ast.get_docstring(ast.parse(TEMPLATE.read_text()))
    line = next((l.strip() for l in doc.splitlines() if l.strip().startswith("rm -f /dev/shm/")), None)
    assert line and f"_{DEFAULT_PORT}_" in line, "the template's docstring should give the rm line for the default port"
    return line.replace(f"_{DEFAULT_PORT}_", f"_{port}_")


def without_the_course() -> dict[str, str]:
    """This environment without the rank hook (no PYTHONPATH), with the ranks on the CPU as the course's CPU
    launches have them, and DeepSpeed's ops from the course's build folder (no rebuild in ~/.cache)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(hardware.cpu_ranks_env(2, gpu_machine=hardware.detect().is_gpu))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(paths.torch_extensions_dir("cpu")))
    hook = subprocess.run([sys.executable, "-c", "import importlib.util as u; s = u.find_spec('sitecustomize'); "
                           "print(s and s.origin)"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert str(environment.RANK_HOOK) not in hook, f"the course's rank hook is still loaded: {hook}"
    return env


def launch_and_clean_up(script: Path, args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Launch ``script`` on 2 CPU ranks with the plain CLI; assert it ended cleanly, left its 2 buffers, and that the
    documented line removed them. Whatever happens, nothing of the launch outlives the call. Returns its output."""
    port = commands.free_port()
    launcher = subprocess.Popen([commands.deepspeed_cli(), "--num_gpus", "2", "--master_port", str(port), str(script),
                                 *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
    try:
        try:
            output, _ = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{script.name} did not end within {timeout} s")
        assert launcher.returncode == 0, f"{script.name} ended with {launcher.returncode}:\n{output[-3000:]}"
        assert not reaper.in_groups([launcher.pid]), "a process of the launch outlived it"
        left = glob(processes.shm_pattern(port))
        assert len(left) == 2, f"DeepSpeed's CPU all-reduce should leave one buffer per rank in /dev/shm: {left}"
        subprocess.run(["sh", "-c", documented_cleanup(port)], check=True, timeout=30)
        assert not glob(processes.shm_pattern(port)), "the documented clean-up line left buffers behind"
        return output
    finally:
        reaper.end(groups=[launcher.pid])         # what is left of the launch, ranks the CLI no longer waits for too
        launcher.wait(timeout=30)
        processes.release_shm_buffers(port)


def test_a_plain_script_that_destroys_its_process_group_ends_cleanly(tmp_path):
    """init_distributed, one all_reduce, destroy_process_group: without the hook, a script that leaves its process
    group to the interpreter's teardown fails now and then (gloo aborts, exit code 250); this one must not."""
    env = without_the_course()
    for _ in range(2):            # ~7 s a launch on 2 idle cores
        output = launch_and_clean_up(SCRIPTS / "plain_allreduce.py", ["--destroy"], tmp_path, env, timeout=120)
        assert "rank 0: sum 2.0" in output and "rank 1: sum 2.0" in output


@pytest.mark.extended        # notebook 08 launches the template through the runner; this is the template on its own
def test_a_copy_of_the_trainer_template_runs_on_cpu_ranks_without_the_course(tmp_path):
    """The template joins CPU ranks itself (its join_cpu_ranks), trains on both and ends cleanly."""
    args = ["--deepspeed", str(paths.ROOT / "configs" / "trainer_zero2_offload.json"),
            "--output_dir", str(tmp_path / "out"), "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--disable_tqdm", "true",
            "--save_strategy", "no"]
    output = launch_and_clean_up(TEMPLATE, args, tmp_path, without_the_course(), timeout=400)
    assert "trained 2 steps on 2 ranks" in output, output[-3000:]
