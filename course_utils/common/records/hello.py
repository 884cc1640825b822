"""The records of notebook 00's first launch (scripts/00_hello.py): who each rank is, what the learner's
``roll_call()`` and ``prepare_then_read()`` returned in every rank."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class RankInfo(Record, name="rank_info"):
    """Who a rank is once it has joined the process group."""
    rank: int
    local_rank: int
    world_size: int
    pid: int
    backend: str
    device: str


@dataclass
class RollCall(Record, name="roll_call"):
    """What one rank's ``roll_call()`` returned, next to the pid the rank itself has."""
    rank: int
    pid: int
    answer: list


@dataclass
class Prepared(Record, name="prepared"):
    """One rank's ``prepare_then_read()``: whether it read the whole file, how often it built it, how long it took,
    and (clock time) when it returned and when its build, if any, was done."""
    rank: int
    read_right: bool
    builds: int
    seconds: float
    returned_at: float
    built_at: float | None = None



@dataclass
class RankEnvironment(Record, name="rank_environment"):
    """The launcher's variables one rank was started with (``received``: ``CUDA_VISIBLE_DEVICES``, ``RANK``,
    ``LOCAL_RANK``, ...; None where unset), and ``CUDA_VISIBLE_DEVICES`` as the rank's script later sees it."""
    rank: int
    received: dict
    visible_now: str | None
