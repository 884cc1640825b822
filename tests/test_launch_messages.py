"""What a launch says: the filter between the ranks' output and what a learner sees, and the messages that name
the rank that failed (from records, from the logs, a signal's likely cause, a timeout)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_utils.common import run_folder
from course_utils.kernel.launch import failures
from course_utils.kernel.launch.result import LaunchResult
from course_utils.kernel.launch.streams import LearnerFilter

HIDDEN = [
    "[launcher] [2025-01-02 10:11:12,345] [INFO] [real_accelerator.py:260:get_accelerator] Setting ds_accelerator to cpu",
    "[rank 1] [2025-01-02 10:11:12,345] [DEBUG] [comm.py:12:init] cdb=None",
    "[launcher] [2025-01-02 10:11:12,345] [WARNING] [runner.py:214:fetch_hostfile] Unable to find hostfile, "
    "will proceed with training with local resources only.",
    "[rank 0] /x/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:4807: FutureWarning: "
    "`torch.distributed._all_gather_base` is a private function and will be deprecated. Please use "
    "`torch.distributed.all_gather_into_tensor` instead.",
    "[rank 1] /x/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
    "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
    "[rank 0] `loss_type=None` was set in the config but it is unrecognized. Using the default loss: `ForCausalLMLoss`.",
    "[rank 0] [2025-01-02 10:11:12,345] [WARNING] [lr_schedules.py:759:get_lr] Attempting to get learning rate from "
    "scheduler before it has started",
    "[rank 1] [2025-01-02 10:11:12,345] [WARNING] [engine.py:2304:_configure_zero_optimizer] **** You are using ZeRO "
    "with an untested optimizer, proceed with caution *****",
    "[rank 0] /x/.venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:661: UserWarning: 'pin_memory' "
    "argument is set as true but no accelerator is found, then device pinned memory won't be used.",
    "[rank 1] Map: 100%|██████████| 1000/1000 [00:00<00:00, 12345.67 examples/s]",
    "[rank 0] [I1128 18:58:51.479929236 socket.cpp:955] [c10d] The client socket has connected to [::ffff:127.0.0.1]:46817",
]
SHOWN = [
    "[rank 0] step 3 loss 2.4512",
    "[rank 0] accuracy 100%|tokens| 5/5 would not be a bar without its time bracket",
    "[rank 0] Traceback (most recent call last):",
    '[rank 0]   File "/x/scripts/02_first_loop.py", line 12, in <module>',
    "[rank 1] ValueError: deliberate failure on rank 1",
    "[launcher] [2025-01-02 10:11:12,345] [WARNING] [engine.py:1:x] something the learner should read",
    "[rank 0] /x/scripts/mine.py:3: FutureWarning: my own code uses a deprecated argument",
    "[rank 1] [W1128 18:58:51.010553556 ProcessGroupGloo.cpp:12] Warning: a collective timed out",
]


@pytest.mark.parametrize("line", HIDDEN)
def test_filter_hides_chatter(line):
    f = LearnerFilter()
    assert not f.shows(line)
    assert f.hidden == 1


@pytest.mark.parametrize("line", SHOWN)
def test_filter_shows_what_teaches(line):
    f = LearnerFilter()
    assert f.shows(line)
    assert f.hidden == 0


def test_filter_hides_the_source_line_echoed_after_a_hidden_warning():
    f = LearnerFilter()
    assert not f.shows(HIDDEN[4])
    assert f.shows("[rank 0]   indented line of another rank")       # a different source: kept
    assert not f.shows("[rank 1]   return func(*args, **kwargs)")     # the echo of rank 1's warning
    assert f.shows("[rank 1]   return func(*args, **kwargs)")         # only the one line after it
    assert f.hidden == 2


# --- failure analysis ---

def fabricated_result(run_dir: Path, returncode: int = 1) -> LaunchResult:
    rank_logs = {0: "step 1\nRuntimeError: Connection closed by peer", 1: "step 1\nValueError: bad"}
    return LaunchResult(returncode=returncode, log="[rank 0] step 1\n[rank 1] step 1", records=[], run_dir=run_dir,
                        command="deepspeed ...", seconds=3.0, world_size=2, rank_logs=rank_logs)


def test_first_failing_rank_is_the_earliest_record(tmp_path):
    (tmp_path / "failures").mkdir()
    for rank, when, error in [(0, 200.5, "RuntimeError: Connection closed by peer"), (1, 200.1, "ValueError: bad")]:
        (tmp_path / "failures" / f"rank{rank}.json").write_text(json.dumps(
            {"rank": str(rank), "time": when, "error": error, "traceback": f"Traceback (most recent call last):\n{error}\n"}))
    assert failures.first_failure(tmp_path, {}) == (1, "Traceback (most recent call last):\nValueError: bad\n")
    message = failures.failure_message(fabricated_result(tmp_path), timed_out=False, timeout=60, note="(3 lines hidden)")
    assert message.startswith("Rank 1 failed (launch exit code 1):")
    assert "ValueError: bad" in message and "Connection closed" not in message
    assert message.endswith("launch.log and ranks/. (3 lines hidden)")


def test_failure_without_records_falls_back_to_the_logs(tmp_path):
    logs = {0: "ok", 1: "x\nTraceback (most recent call last):\n  File ...\nKeyError: 'a'"}
    assert failures.first_failure(tmp_path, logs) == (1, "Traceback (most recent call last):\n  File ...\nKeyError: 'a'")
    message = failures.failure_message(fabricated_result(tmp_path, 3), timed_out=False, timeout=60)
    assert message.startswith("Launch failed (exit code 3) without a Python traceback")


KILLED = ("[launcher] [2026-11-25 09:02:52,648] [ERROR] [launch.py:259:sigkill_handler] ['/x/python', '-u', "
          "'scripts/05_out_of_memory.py', '--local_rank=1', '--cgroup_procs', '/x'] exits with return code = {code}")


def test_a_rank_killed_by_a_signal_is_named_with_its_likely_cause(tmp_path):
    """The launcher's line shows the last rank it started whichever rank failed: the rank is the one that left no
    record (rank 0 recorded its lost connection), and none is named when two left none."""
    result = fabricated_result(tmp_path)
    result.log += "\n" + KILLED.format(code=-9).replace("--local_rank=1", "--local_rank=0")
    message = failures.failure_message(result, timed_out=False, timeout=60)
    assert message.startswith("One of ranks 0, 1 was killed by SIGKILL (exit status -9)")
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "rank0.json").write_text(json.dumps(
        {"rank": "0", "time": 1.0, "error": "RuntimeError", "traceback": "RuntimeError: Connection closed by peer [x]"}))
    message = failures.failure_message(result, timed_out=False, timeout=60)
    assert message.startswith("Rank 1 was killed by SIGKILL (exit status -9)") and "out-of-memory killer" in message
    assert failures.killed_signal(KILLED.format(code=1)) is None          # an exception's exit status is not a signal
    assert failures.killed_signal("[launcher 127.0.0.2] " + KILLED.format(code=-6).partition("] ")[2]) == (6, "127.0.0.2")


def test_a_peer_that_only_lost_its_connection_is_not_blamed(tmp_path):
    """The launcher may log the peer's exit first; the rank that left neither a record nor a finish mark vanished."""
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "rank0.json").write_text(json.dumps(
        {"rank": "0", "time": 1.0, "error": "RuntimeError", "traceback": "RuntimeError: Connection closed by peer [x]"}))
    message = failures.failure_message(fabricated_result(tmp_path), timed_out=False, timeout=60)
    assert message.startswith("Rank 1 ended without a Python traceback") and "Rank 0 only lost its connection" in message


def test_timeout_message_shows_every_rank(tmp_path):
    message = failures.failure_message(fabricated_result(tmp_path, 124), timed_out=True, timeout=12)
    assert message.startswith("Launch timed out after 12 s")
    assert "--- rank 0 (last lines) ---" in message and "--- rank 1 (last lines) ---" in message


def test_hidden_note(tmp_path):
    assert failures.hidden_note(0, tmp_path) == ""
    assert failures.hidden_note(37, tmp_path) == (
        f"(37 lines of launcher/library chatter hidden: {tmp_path}/launch.log, or verbose=True)")


# --- single tools ---


def test_the_rank_its_memory_cgroup_saw_killed_is_named(tmp_path, monkeypatch):
    """Two ranks left no record (the launcher ended the other one): the memory cgroup that counted an out-of-memory
    kill names the rank, whichever rank the launcher's line shows."""
    from course_utils.kernel.launch import memcap

    groups = {name: tmp_path / name for name in ("g0", "g1")}
    for name, kills in (("g0", 0), ("g1", 1)):
        groups[name].mkdir()
        (groups[name] / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    (groups["g1"] / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert [memcap.oom_kills(groups[n]) for n in ("g0", "g1")] == [0, 2]    # v2's file first, else v1's
    assert memcap.oom_kills(tmp_path / "gone") == 0
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("COURSE_RUN_DIR", str(run))
    for rank, name in ((0, "g0"), (1, "g1")):
        monkeypatch.setenv("RANK", str(rank))
        (groups[name] / "cgroup.procs").write_text("")
        run_folder.join_memory_cgroup(groups[name] / "cgroup.procs")
    assert run_folder.memory_cgroups(run) == {0: groups["g0"], 1: groups["g1"]}
    result = fabricated_result(run)
    result.log += "\n" + KILLED.format(code=-9).replace("--local_rank=1", "--local_rank=0")
    message = failures.failure_message(result, timed_out=False, timeout=60)
    assert message.startswith("Rank 1 was killed by SIGKILL (exit status -9) and left no Python traceback: the "
                              "kernel's out-of-memory killer, which its memory cgroup counted."), message
