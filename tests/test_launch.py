"""The runner: real `deepspeed` launches that succeed, fail loudly, time out, and leave nothing behind."""
from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import processes_of
from course_utils.kernel import hardware, launch
from course_utils.kernel.launch.stacks import main_thread_stack, rank_stacks

SCRIPTS = Path(__file__).parent / "scripts"


def test_interrupt_kills_every_process_of_the_launch_and_a_hang_shows_each_ranks_stack():
    """A notebook interrupt is a KeyboardInterrupt in the cell's thread: the launch must not survive it. Before
    interrupting, a hung launch (rank 0 waits in an all_reduce that rank 1 never reaches) is asked for its ranks'
    Python stacks, as the runner does at a timeout: the rank hook's faulthandler answers on SIGUSR1, also in a
    rank blocked inside the collective."""
    # A kernel handles SIGINT with Python's handler. This worker may not: an earlier test in it can leave SIGINT
    # ignored (seen after notebooks 02, 04, 05, 08, 09, 11, 12 and 13 ran in one worker), and then interrupt_main()
    # does nothing and the launch runs into its timeout. The test sets the kernel's handler for its own duration.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    seen: dict = {}

    def stacks_then_interrupt():
        try:        # the ranks are asked once both have said they reached their wait (not while they import)
            deadline = time.monotonic() + 100
            while time.monotonic() < deadline and not seen.get("stacks"):
                new = [d for d in sorted(launch.paths.runs_dir().glob("*-one_rank_skips-*")) if d not in seen["before"]]
                logs = " ".join(p.read_text() for p in new[0].glob("ranks/*.log")) if new else ""
                if "rank 0 reached its wait" in logs and "rank 1 reached its wait" in logs:
                    time.sleep(1)                 # rank 0 from its print into the all_reduce
                    stacks = rank_stacks(new[0])
                    if "in all_reduce" in stacks.get(0, "") and "in wait_for_data" in stacks.get(1, ""):
                        # the launch's processes are this process's descendants (/proc/<pid>/stat only)
                        seen.update(run_dir=new[0], stacks=stacks,
                                    alive_before=len(psutil.Process().children(recursive=True)))
                time.sleep(0.5)
        except Exception as err:              # noqa: BLE001 — reported by the assertions below
            seen["error"] = repr(err)
        finally:
            _thread.interrupt_main()

    seen["before"] = sorted(launch.paths.runs_dir().glob("*-one_rank_skips-*"))
    threading.Thread(target=stacks_then_interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch.deepspeed(SCRIPTS / "one_rank_skips.py", procs=2, timeout=120, quiet=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen.get("stacks"), f"no stacks of both ranks at their waits within 100 s ({seen.get('error', 'no error')})"
    assert "wait_for_data" not in seen["stacks"][0] and "in all_reduce" not in seen["stacks"][1]
    main0 = main_thread_stack(seen["stacks"][0])
    assert "torch/distributed/distributed_c10d.py" in main0 and "site-packages" not in main0, main0
    assert 'tests/scripts/one_rank_skips.py", line 17 in <module>' in main0, main0
    assert seen["alive_before"] >= 4, "the launch should have been running (the CLI, its launcher, 2 ranks)"
    assert not processes_of(seen["run_dir"])


@pytest.mark.extended      # `make test` runs two notebooks at a time, each launch on its own port, all the time
def test_two_launches_in_parallel_succeed_with_their_own_ports(capsys):
    """Two launches at once (two notebooks, or two tests) get their own ports; a successful launch returns
    its log and records and prints the command and the outcome, not the library chatter. The second is a
    learner's plain script (no course imports, no finish()): its ranks end through the rank hook."""
    results: dict = {}

    def run(key):
        if key == "a":
            results[key] = launch.deepspeed(SCRIPTS / "record_world.py", procs=2, timeout=180, config="zero0.json")
        else:
            results[key] = launch.deepspeed(SCRIPTS / "plain_allreduce.py", procs=2, timeout=180, quiet=True)

    threads = [threading.Thread(target=run, args=(k,)) for k in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {"a", "b"}
    plain = results["b"]
    assert plain.returncode == 0 and "rank 0: sum 2.0" in plain.log and "rank 1: sum 2.0" in plain.log
    assert sorted(m.name for m in (plain.run_dir / "finished").iterdir()) == ["rank0", "rank1"]   # the hook's marks
    ports = {r.command.split("--master_port ")[1].split()[0] for r in results.values()}
    assert len(ports) == 2

    result, printed = results["a"], capsys.readouterr().out      # "b" ran quiet: only "a" printed
    assert result.returncode == 0
    worlds = result.per_rank("world")
    assert sorted(worlds) == [0, 1]
    assert all(w["world_size"] == 2 and w["sum"] == 2.0 for w in worlds.values())
    assert worlds[0]["config"].endswith("configs/zero0.json")
    assert "[rank 0]" in result.log and "[rank 1]" in result.log
    assert (result.run_dir / "launch.log").read_text().strip() == result.log.strip()
    assert sorted(m.name for m in (result.run_dir / "finished").iterdir()) == ["rank0", "rank1"]   # finish()'s marks
    assert result.command.split("&& ", 1)[1].startswith("deepspeed --num_gpus 2")
    for r in results.values():
        assert not processes_of(r.run_dir)
        port = r.command.split("--master_port ")[1].split()[0]
        assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*")), "shm buffers leaked"
    # the cell shows the command and the outcome, not the library chatter, and says where the hidden lines are
    assert printed.startswith("$ cd ")
    assert "[INFO]" in result.log and "[INFO]" not in printed
    assert "shm_comm_op built successfully" in result.log and "built successfully" not in printed
    assert result.hidden_lines > 0
    assert f"{result.hidden_lines} lines of launcher/library chatter hidden" in printed.splitlines()[-1]


# Simulated nodes (2 × 2 ranks) are launched by notebook 01 (its test checks the global ranks) and the
# commands they need are unit-tested in test_launch_units.py.


def test_missing_script_and_bad_config_fail_before_any_rank_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        launch.deepspeed("no_such_script.py")
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_micro_batch_size_per_gpu": 2,}')
    from course_utils.kernel.configs import ConfigError
    with pytest.raises(ConfigError, match="not valid JSON"):
        launch.deepspeed(SCRIPTS / "record_world.py", config=bad)


def test_command_kills_a_hanging_tool():
    with pytest.raises(launch.CommandError, match="timed out after 2 s") as err:
        launch.command(["python", "-c", "print('started', flush=True); import time; time.sleep(60)"], timeout=2)
    assert isinstance(err.value, RuntimeError), "command() documents a RuntimeError"
    assert "started" in str(err.value), "the message shows the end of the tool's output"
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(60)" in " ".join(p.info["cmdline"] or [])]
    assert not leftovers


def test_launch_dies_with_the_process_that_started_it(tmp_path):
    """A kernel killed outright gets no chance to clean up: the launch must still end, and its /dev/shm all-reduce
    buffers (about 66 MB per CPU rank) must go with it. Killed as Jupyter kills a kernel: SIGKILL to its whole process
    group (a kernel runs in a session of its own), which the launch's watchdog must not be in."""
    import subprocess
    import sys

    starter = subprocess.Popen([sys.executable, "-c", (
        "import sys; from course_utils import launch; "
        f"launch.deepspeed({str(SCRIPTS / 'allreduce_then_sleep.py')!r}, procs=2, timeout=300, name='orphan_check')")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline and run_dir is None:
        time.sleep(0.5)
        dirs = [d for d in launch.paths.runs_dir().glob("*-orphan_check-*") if (d / "metrics" / "rank1.jsonl").exists()]
        run_dir = dirs[0] if dirs else None
    assert run_dir, "the launch did not get past its all_reduce"
    assert len(processes_of(run_dir)) >= 3
    port = next(c.split("--master_port ")[1].split()[0] for c in
                (" ".join(p.cmdline()) for p in processes_of(run_dir)) if "--master_port " in c)
    buffers = f"deepspeed*_{port}_*"
    if not hardware.detect().is_gpu:      # CPU ranks all-reduce through DeepSpeed's shm op
        assert list(Path("/dev/shm").glob(buffers)), "the script should have created the shm buffers"
    os.killpg(starter.pid, signal.SIGKILL)
    starter.wait()
    deadline = time.monotonic() + 30
    while (processes_of(run_dir) or list(Path("/dev/shm").glob(buffers))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_of(run_dir), "ranks outlived the killed process that started them"
    assert not list(Path("/dev/shm").glob(buffers)), "the launch's /dev/shm buffers outlived it"


def test_a_watchdog_acts_when_its_starter_dies_before_the_watchdog_is_ready(tmp_path):
    """The starter dies the moment after it started its watchdog, while the watchdog's interpreter is still
    starting: the parent's death is not missed (the watchdog's own call, ``os.mkdir``, still runs)."""
    import subprocess
    import sys

    marker = tmp_path / "acted"
    subprocess.run([sys.executable, "-c", "import os; from course_utils.kernel.launch.processes import watchdog; "
                    f"watchdog('call', 'os:mkdir', {str(marker)!r}); os._exit(0)"], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.is_dir(), "the watchdog did not act on its starter's death"


def test_the_rank_that_aborts_is_the_one_reported_and_its_peer_keeps_its_traceback():
    """Rank 1 aborts while rank 0 waits for it in an all_reduce: rank 0 dies of a lost connection within the same
    second. DeepSpeed's launcher looks at its ranks once a second and reports the first it finds ended, so without
    the rank hook's wait it reported rank 0's status (1) in 2 of 12 launches; with it, rank 1's (-6) in 20 of 20.
    The course names rank 1 (the line the launcher prints shows the last rank it started, whichever failed)."""
    with pytest.raises(launch.LaunchError) as caught:
        launch.deepspeed(SCRIPTS / "one_rank_aborts.py", procs=2, timeout=120, quiet=True)
    result = caught.value.result
    assert "exits with return code = -6" in result.log, result.log
    assert str(caught.value).startswith("Rank 1 was killed by SIGABRT (exit status -6)"), str(caught.value)
    assert "Connection reset by peer" in result.rank_logs[0] or "Connection closed by peer" in result.rank_logs[0]
    assert result.returncode == 256 - 6
    assert not processes_of(result.run_dir)
