"""The runner's parts on their own, without starting a launch: options, command lines, the ranks'
environment, supervision, the rank hook and the single-tool runner (what a launch says to the learner:
test_launch_messages.py)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from course_utils.kernel import hardware
from course_utils.common import paths as launch_paths
from course_utils.kernel.configs import ConfigError
from course_utils.kernel.launch import CommandError, LaunchOptions, command, commands, environment

CLI = "/venv/bin/deepspeed"
SCRIPT = Path(__file__).parent / "scripts" / "record_world.py"


# --- options and command lines ---

def test_options_are_frozen_and_know_the_world_size():
    options = LaunchOptions(procs=2, nodes=3)
    assert options.world_size == 6
    assert options.precheck and options.check and not options.verbose
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.procs = 4
    with pytest.raises(ValueError, match="procs"):
        LaunchOptions(procs=0)


def test_one_node_command(tmp_path):
    [cmd] = commands.node_commands(CLI, SCRIPT, ["--steps", "3"], LaunchOptions(procs=2), 29512, tmp_path)
    assert cmd[0] == CLI
    assert cmd[cmd.index("--num_gpus") + 1] == "2"
    assert cmd[cmd.index("--master_port") + 1] == "29512"
    assert cmd[cmd.index("--enable_each_rank_log") + 1].endswith("ranks")
    assert cmd[-3:] == [commands.paths.relative(SCRIPT), "--steps", "3"]
    shown = commands.shown_command([cmd])
    assert shown.startswith(f"cd {commands.paths.ROOT} && deepspeed --num_gpus 2 ")
    assert CLI not in shown


def test_simulated_nodes_get_a_hostfile_and_no_ssh(tmp_path):
    cmds = commands.node_commands(CLI, SCRIPT, [], LaunchOptions(procs=2, nodes=2), 29512, tmp_path)
    assert len(cmds) == 2
    for n, cmd in enumerate(cmds):
        assert "--no_ssh" in cmd and "--num_gpus" not in cmd
        assert cmd[cmd.index("--node_rank") + 1] == str(n)
        assert cmd[cmd.index("--master_port") + 1] == "29512"
    assert (tmp_path / "hostfile").read_text() == "node0 slots=2\nnode1 slots=2\n"
    assert commands.shown_command(cmds).count("\n") == 1


def test_config_is_checked_unless_precheck_is_off(tmp_path):
    bad = {"train_batch_size": 3, "train_micro_batch_size_per_gpu": 1}     # 3 is not 1 × 2 ranks
    with pytest.raises(ConfigError):
        commands.config_args(LaunchOptions(procs=2, config=bad), tmp_path)
    flag, path = commands.config_args(LaunchOptions(procs=2, config=bad, precheck=False), tmp_path)
    assert flag == "--deepspeed_config"
    assert json.loads(Path(path).read_text()) == bad                      # passed on unchanged
    broken = tmp_path / "broken.json"
    broken.write_text('{"train_batch_size": 2,}')
    options = LaunchOptions(procs=2, config=broken, precheck=False, config_arg="--deepspeed")
    assert commands.config_args(options, tmp_path) == ["--deepspeed", str(broken)]
    assert commands.config_args(LaunchOptions(procs=2), tmp_path) == []


def test_shipped_config_is_found_by_name_either_way(tmp_path):
    for precheck in (True, False):
        _, path = commands.config_args(LaunchOptions(procs=2, config="zero0.json", precheck=precheck), tmp_path)
        assert path == "configs/zero0.json"


# --- the ranks' environment ---

def test_rank_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.Hardware(accelerator="cpu", gpus=0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    env = environment.rank_environment(tmp_path, world_size=4, extra={"MY_FLAG": 1})
    assert env["COURSE_RUN_DIR"] == str(tmp_path)
    hook = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(hook) / "sitecustomize.py").is_file()
    assert env["OMP_NUM_THREADS"] == "2" and env["DS_ACCELERATOR"] == "cpu"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE", "a rank's OpenMP threads sleep while they wait, not spin"
    assert env["MY_FLAG"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")           # the learner's own setting wins
    assert environment.rank_environment(tmp_path, world_size=4)["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.setattr(hardware, "detect", lambda: hardware.Hardware(accelerator="cuda", gpus=2))
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert "OMP_NUM_THREADS" not in environment.rank_environment(tmp_path, world_size=2)


# --- what the learner sees of the stream ---

def test_command_returns_output_and_raises_on_a_failure():
    assert command([sys.executable, "-c", "print('hi')"]).strip() == "hi"
    with pytest.raises(CommandError, match="exited with 3") as err:
        command([sys.executable, "-c", "print('oops'); raise SystemExit(3)"])
    assert isinstance(err.value, RuntimeError) and "oops" in str(err.value)


def test_rank_hook_asks_cpuinfo_once_per_machine(tmp_path):
    """DeepSpeed's op builders ask py-cpuinfo twice per op load (each ~1 s of busy clock measurement): the rank
    hook keeps the answer in $TORCH_EXTENSIONS_DIR and hands it back unchanged."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(environment.RANK_HOOK), "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    ask = "import cpuinfo, json; a = cpuinfo.get_cpu_info(); print(json.dumps([a == cpuinfo.get_cpu_info(), a]))"
    same, first = json.loads(subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True,
                                            check=True).stdout)
    assert same and first["arch"]
    (cached,) = tmp_path.glob("cpuinfo-*.json")
    assert json.loads(cached.read_text()) == first
    cached.write_text(json.dumps({**first, "brand_raw": "read from the cache"}))
    again = json.loads(subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True,
                                      check=True).stdout)[1]
    assert again["brand_raw"] == "read from the cache"


def test_supervise_ends_idle_launchers_once_every_rank_finished(tmp_path):
    """When every rank has passed finish(), the launch is over: a launcher still polling is not waited for."""
    import subprocess
    import time

    from course_utils.kernel.launch.runner import _supervise
    from course_utils.kernel.launch.streams import Streams

    (tmp_path / "ranks").mkdir()
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    marks = iter([False, False, True])
    started = time.monotonic()
    timed_out, finished = _supervise([idle], Streams([idle], tmp_path / "ranks"), lambda lines: None,
                                     started, 30, lambda: next(marks))
    assert (timed_out, finished) == (False, True)
    assert idle.poll() is not None and time.monotonic() - started < 10

    still = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert _supervise([still], Streams([still], tmp_path / "ranks"), lambda lines: None,
                      time.monotonic(), 30, lambda: False) == (False, False)
    assert still.returncode == 0


def test_a_timeout_takes_the_stacks_before_the_kill_and_the_error_shows_them(tmp_path):
    """On the timeout, _supervise runs on_timeout() while the launch is still alive, then kills it; the error of
    a timed-out launch with stacks shows each rank's main-thread frames and names a rank that gave none."""
    import subprocess
    import time

    from course_utils.kernel.launch.failures import failure_message
    from course_utils.kernel.launch.stacks import main_thread_stack
    from course_utils.kernel.launch.result import LaunchResult
    from course_utils.kernel.launch.runner import _supervise
    from course_utils.kernel.launch.streams import Streams

    (tmp_path / "ranks").mkdir()
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    alive_at_dump = []
    timed_out, _ = _supervise([hung], Streams([hung], tmp_path / "ranks"), lambda lines: None, time.monotonic(), 1,
                              lambda: False, lambda: alive_at_dump.append(hung.poll() is None))
    assert timed_out and alive_at_dump == [True] and hung.poll() is not None

    dump = ('Thread 0x00007f01 (most recent call first):\n  File "/v/lib/python3.11/threading.py", line 331 in wait\n\n'
            'Current thread 0x00007f02 (most recent call first):\n'
            '  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
            f'  File "{launch_paths.ROOT}/scripts/x.py", line 16 in <module>\n')
    result = LaunchResult(returncode=124, log="", records=[], run_dir=tmp_path, command="", seconds=1.0,
                          world_size=2, stacks={0: dump})
    message = failure_message(result, True, 30)
    assert "rank 0: where it was" in message and "(no stack from rank(s) [1]" in message
    assert 'File "torch/distributed/distributed_c10d.py", line 3252 in all_reduce' in message
    assert 'File "scripts/x.py", line 16 in <module>' in message and "threading.py" not in message
    deep = "Current thread 0x1 (most recent call first):\n" + "".join(f'  File "t.py", line {i} in f{i}\n' for i in range(20))
    shown = main_thread_stack(deep + '  File "s.py", line 3 in <module>\n').splitlines()
    assert shown[0].endswith("in f0") and shown[-1].endswith("in <module>") and "(9 frames)" in shown[6]


def test_rank_hook_compiles_muon_kernels_when_first_called():
    """Every ZeRO engine imports DeepSpeed's Muon module (is_zero_supported_optimizer), whose three
    ``@compiler.compile()`` kernels imported TorchDynamo and Inductor at once (~3 s per rank): the rank hook
    defers ``torch.compile`` to the kernels' first call."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(environment.RANK_HOOK)}
    probe = ("import sys; from deepspeed.runtime.zero.muon import original_muon as m; "
             "print(int('torch._inductor' in sys.modules), int(hasattr(m.zeropower_via_newtonschulz5, '__wrapped__')))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[-2:] == ["0", "1"], out


def test_a_launch_is_done_when_every_rank_finished_or_some_failed(tmp_path):
    """Finished marks end a launch as a success; once every rank has ended and one died of an exception
    (its failure record), the launch ends as a failure without waiting for the launcher's polling."""
    from course_utils.kernel.launch.runner import _ranks_done

    (tmp_path / "finished").mkdir()
    (tmp_path / "failures").mkdir()
    assert _ranks_done(tmp_path, 2) is False
    (tmp_path / "finished" / "rank0").touch()
    assert _ranks_done(tmp_path, 2) is False                 # rank 1 may still be working
    (tmp_path / "failures" / "rank1.json").write_text("{}")
    assert _ranks_done(tmp_path, 2) == "failed"
    (tmp_path / "failures" / "rank1.json").unlink()
    (tmp_path / "finished" / "rank1").touch()
    assert _ranks_done(tmp_path, 2) is True


def _as_rank(tmp_path, code: str):
    """Run ``code`` as a course rank would start (rank hook on PYTHONPATH, RANK and COURSE_RUN_DIR set)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(environment.RANK_HOOK), "RANK": "1", "COURSE_RUN_DIR": str(tmp_path)}
    env.pop("COURSE_RANK_PID", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_launch_processes_freeze_what_importing_torch_made_and_others_are_left_alone(tmp_path):
    """A rank, DeepSpeed's runner and its launcher import torch with the collector off, then freeze what it made; the
    collector is on again after. A file the rank opened before is still flushed when the rank ends (gc.get_objects()
    does not list frozen objects). Any other process under the hook keeps Python's default."""
    import subprocess

    probe = "import gc, torch; print(gc.get_freeze_count() > 50_000, gc.isenabled(), flush=True)"
    kept = tmp_path / "kept.txt"
    rank = _as_rank(tmp_path, f"LOG = open({str(kept)!r}, 'w')\nLOG.write('opened before torch')\n{probe}")
    assert rank.returncode == 0 and rank.stdout.split() == ["True", "True"], rank.stderr[-2000:]
    assert kept.read_text() == "opened before torch"
    env = {**os.environ, "PYTHONPATH": str(environment.RANK_HOOK)}
    for name in ("RANK", "COURSE_RUN_DIR", "COURSE_RANK_PID"):
        env.pop(name, None)
    runner = tmp_path / "deepspeed"          # DeepSpeed's console script, as `deepspeed ...` starts it
    runner.write_text(probe)
    for argv, frozen in (([str(runner)], "True"), (["-c", probe], "False")):
        out = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.split() == [frozen, "True"], (argv, out.stderr[-2000:])


def test_a_rank_that_returns_ends_without_the_teardown_that_can_abort(tmp_path):
    """A learner's script need not call finish(): a rank that returns ends with its status, its open files
    flushed and its finished mark, before the interpreter's teardown (where gloo can abort, exit -6) runs."""
    out = tmp_path / "kept.txt"
    ok = _as_rank(tmp_path, "import os\n"
                            "class Teardown:\n    def __del__(self): os.abort()      # as gloo's threads can\n"
                            f"bomb = Teardown()\nLOG = open({str(out)!r}, 'w')\nLOG.write('written, never closed')\n"
                            "print('done')")
    assert (ok.returncode, ok.stdout.strip()) == (0, "done"), ok.stderr
    assert out.read_text() == "written, never closed"
    assert (tmp_path / "finished" / "rank1").exists()

    (tmp_path / "finished" / "rank1").unlink()
    assert _as_rank(tmp_path, "import sys; sys.exit(3)").returncode == 3
    failed = _as_rank(tmp_path, "raise ValueError('boom')")
    assert failed.returncode == 1 and "ValueError: boom" in failed.stderr
    assert not (tmp_path / "finished" / "rank1").exists()
    assert json.loads((tmp_path / "failures" / "rank1.json").read_text())["error"] == "ValueError: boom"


def test_only_the_rank_itself_reports_a_failure(tmp_path):
    """A rank's own child processes (DataLoader or compile workers) inherit its environment but are not
    ranks: their exceptions leave no failure record and they leave no finished mark."""
    child = _as_rank(tmp_path, "import subprocess, sys\n"
                               "r = subprocess.run([sys.executable, '-c', 'raise ValueError(1)'])\n"
                               "print(r.returncode)")
    assert child.stdout.strip() == "1"
    assert not (tmp_path / "failures").exists()
    assert [p.name for p in (tmp_path / "finished").iterdir()] == ["rank1"]      # the rank's own mark only


def test_the_trainer_counting_one_rank_on_cpu_is_named_in_the_error():
    """A plain Trainer script on CPU ranks dies of DeepSpeed's batch assertion (4 != 4 * 1 * 2): the error says
    why (the Trainer counted one rank) and what to change; DeepSpeed's own batch message is left alone."""
    from course_utils.kernel.launch.failures import diagnosis

    trainer = ('  File "/v/site-packages/transformers/trainer.py", line 1, in train\nAssertionError: Check batch '
               'related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * '
               'world_size 4 != 4 * 1 * 2')
    assert "counted itself alone" in diagnosis(trainer) or "ONE rank" in diagnosis(trainer)
    assert "use_configured_state" in diagnosis(trainer) and "COURSE_HOOK_TRAINER=0" in diagnosis(trainer)
    assert diagnosis(trainer.replace("4 != 4 * 1 * 2", "64 != 32 * 4 * 2")) == ""
    assert diagnosis("RuntimeError: something else") == ""


def test_a_name_the_notebook_imported_is_named_when_an_exported_function_misses_it():
    """An exercise function runs in the ranks from the file export_function wrote (torch and dist imported, nothing
    else): a NameError there says to import the name inside the function; a script's own NameError is left alone."""
    from course_utils.kernel.launch.failures import diagnosis

    exported = ('  File "/c/build/exercises/log_metrics.py", line 6, in log_metrics\n'
                "    ok = math.isfinite(loss.item())\nNameError: name 'math' is not defined")
    assert "import what `math` names inside your function" in diagnosis(exported)
    assert diagnosis(exported.replace("/exercises/", "/scripts/")) == "", "a script's own NameError is its own"


def test_lessons_that_need_ranks_get_them_on_any_machine():
    """A launch says how many ranks its lesson needs; with fewer GPUs it runs on CPU ranks and says so,
    while single-device lessons (no min_ranks) keep the GPU. Simulated machines: 0, 1, 2 and 8 GPUs."""
    from course_utils.kernel.hardware import Hardware, placement

    machine = {n: Hardware(accelerator="cuda" if n else "cpu", gpus=n, gpu_names=("GPU",) * n,
                           backend="nccl" if n else "gloo") for n in (0, 1, 2, 8)}
    assert placement(machine[0], None, 2) == placement(machine[0]) and placement(machine[0]).procs == 2
    assert not placement(machine[0], None, 2).cpu_on_gpu_machine          # a laptop: CPU ranks anyway, no note
    one = placement(machine[1], None, 2)
    assert (one.procs, one.cpu_on_gpu_machine) == (2, True) and "1 GPU:" in one.note and "CPU ranks" in one.note
    assert placement(machine[1]) == placement(machine[1], None, None)
    assert (placement(machine[1]).procs, placement(machine[1]).cpu_on_gpu_machine) == (1, False)   # offload, fp16
    assert (placement(machine[2], None, 2).procs, placement(machine[2], None, 2).cpu_on_gpu_machine) == (2, False)
    assert placement(machine[2], 4).cpu_on_gpu_machine and placement(machine[2], 4).procs == 4     # 03's 4 ranks
    assert (placement(machine[8], None, 2).procs, placement(machine[8], 4).procs) == (8, 4)
    assert not placement(machine[8], 4).cpu_on_gpu_machine


def test_a_stall_counts_only_once_every_rank_has_printed_and_then_nothing_came():
    """stall=: silence before every rank has printed (imports, start-up) is not a hang; silence after it is."""
    import time
    from types import SimpleNamespace

    from course_utils.kernel.launch.runner import Stall

    stall = Stall(0.2, world_size=2)
    streams = SimpleNamespace(rank_text={0: ["step 0"]})
    time.sleep(0.3)
    assert not stall.expired([], streams), "rank 1 has not printed yet"
    streams.rank_text[1] = ["step 0"]
    assert not stall.expired(["[rank 1] step 0"], streams), "a line just came"
    time.sleep(0.3)
    assert stall.expired([], streams) and stall.fired


def test_rank_0_keeps_each_distinct_config_deepspeed_read_and_the_cell_names_it(tmp_path, capsys):
    """The rank hook writes what rank 0's DeepSpeedConfig parsed (once per distinct config, a refused one too) with
    the batch sizes DeepSpeed resolved; after the launch one line names them (configs_shown)."""
    import subprocess
    from course_utils.kernel.launch import configs_shown

    code = ("from deepspeed.runtime.config import DeepSpeedConfig\n"
            "c = {'train_micro_batch_size_per_gpu': 3, 'gradient_accumulation_steps': 2, 'bf16': {'enabled': True},"
            " 'zero_optimization': {'stage': 2}}\n"
            "DeepSpeedConfig(c); DeepSpeedConfig(dict(c))\n"            # the same config twice (zero.Init, initialize)
            "try:\n    DeepSpeedConfig({'train_batch_size': 5, 'train_micro_batch_size_per_gpu': 2})\n"
            "except Exception as e:\n    print('refused', type(e).__name__)\n")
    env = {**os.environ, "PYTHONPATH": str(environment.RANK_HOOK), "RANK": "0", "COURSE_RUN_DIR": str(tmp_path)}
    env.pop("COURSE_RANK_PID", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "refused" in done.stdout, done.stderr
    entries = configs_shown.show(tmp_path)
    assert [e["config"].get("train_batch_size") for e in entries] == [None, 5]
    assert entries[0]["config"]["zero_optimization"] == {"stage": 2}
    line = capsys.readouterr().out.strip()
    assert line.startswith("DeepSpeed configs the ranks used: 1. ZeRO stage 2, bf16, train_batch_size 6 = 3 × 2 × 1 "
                           "ranks; 2. refused by DeepSpeed (AssertionError: "), line
    assert line.endswith("configs/")
    # rank 1 writes none
    env["RANK"] = "1"
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-c", code], env={**env, "COURSE_RUN_DIR": str(other)}, capture_output=True,
                   timeout=120)
    assert configs_shown.read(other) == []


def test_a_launch_port_comes_from_below_the_kernels_ephemeral_range_and_is_free(tmp_path, monkeypatch):
    """A port from the ephemeral range can be taken, before a rank binds it, as the local end of any connection the
    machine opens; the launch ports come from below it, are free, and differ from one another."""
    import socket

    from course_utils.kernel.launch import commands

    ephemeral = commands.ephemeral_ports()
    ports = [commands.free_port() for _ in range(20)]
    assert len(set(ports)) == 20 and all(1024 <= p < ephemeral.start for p in ports)
    with socket.socket() as held:                        # a port held by someone else is never handed out
        held.bind(("", 0))
        taken = held.getsockname()[1]
        fake = tmp_path / "range"
        fake.write_text(f"{taken + 1000}\t{taken + 2000}\n")
        monkeypatch.setattr(commands, "EPHEMERAL_RANGE", fake)
        assert commands.ephemeral_ports() == range(taken + 1000, taken + 2001)
        monkeypatch.setattr(commands.random.SystemRandom, "choice", lambda self, r: taken)
        with pytest.raises(RuntimeError, match="no free TCP port"):
            commands.free_port()


def test_two_processes_picking_the_same_free_port_get_different_ones(monkeypatch):
    """Two kernels side by side once drew the same free port, and the second launch's rank 0 found it taken
    ("EADDRINUSE"): a port this process handed out is claimed on the machine until its rank has had time to bind it,
    and another process that draws it draws again."""
    import subprocess

    from course_utils.kernel.launch import commands

    first = commands.ephemeral_ports().start - 2        # below the ephemeral range, as free_port draws
    monkeypatch.setattr(commands.random.SystemRandom, "choice", lambda self, r: first)
    assert commands.free_port() == first                # claimed by this process from now on
    code = ("import random, sys\nfrom course_utils.kernel.launch import commands\n"
            f"draws = iter([{first}, {first}, {first + 1}])\n"
            "random.SystemRandom.choice = lambda self, r: next(draws)\n"
            "print(commands.free_port())\n")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert int(other.stdout.split()[-1]) == first + 1, "the other process was handed the port this one holds"
    for claim in commands._claims:                      # without the claims, the other process gets the same port
        claim.close()
    commands._claims.clear()
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert int(again.stdout.split()[-1]) == first
