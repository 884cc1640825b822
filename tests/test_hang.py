"""A hung launch: the runner's timeout takes every rank's Python stack before it kills the launch.

In a module of its own so that pytest-xdist starts it early (``conftest.expected_seconds``): it waits most of
its half minute, time in which the other worker's notebook has the CPU to itself.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import processes_of
from course_utils import launch

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_hang_is_reported_with_every_ranks_stack_then_nothing_remains():
    """Rank 0 waits in all_reduce, rank 1 never gets there: at the timeout the runner takes both ranks' Python
    stacks (faulthandler, on SIGUSR1 from the rank hook) and puts where each one was into the error."""
    with pytest.raises(launch.LaunchError) as err:
        # long enough for both ranks to reach their waits on a loaded 2-core machine; they sleep meanwhile
        launch.deepspeed(SCRIPTS / "one_rank_skips.py", procs=2, timeout=30, quiet=True)
    result, message = err.value.result, str(err.value)
    assert result.returncode == 124
    assert sorted(result.stacks) == [0, 1], message
    assert "in all_reduce" in result.stacks[0] and "wait_for_data" not in result.stacks[0]
    assert "in wait_for_data" in result.stacks[1] and "in all_reduce" not in result.stacks[1]
    rank0 = message[message.index("--- rank 0"):message.index("--- rank 1")]
    assert "torch/distributed/distributed_c10d.py" in rank0 and "site-packages" not in rank0, rank0
    assert "one_rank_skips.py\", line 16 in <module>" in rank0, rank0
    assert len(list((result.run_dir / "stacks").glob("rank*.txt"))) == 2
    assert not processes_of(result.run_dir), "a rank survived the timeout"
