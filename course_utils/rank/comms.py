"""What a rank's collectives moved, read from DeepSpeed's own comms logger (notebooks 03 and 06).

The logger is switched on by a config section, ``"comms_logger": {"enabled": true, "prof_all": true}``
(:func:`with_comms_logger` adds it); ``deepspeed.initialize`` hands it to ``deepspeed.comm.configure``.
From then on every collective that goes through ``deepspeed.comm`` is logged under its op name with its
*message size*: the bytes of the op's tensor argument, as ``deepspeed/comm/utils.py``
(``get_msg_size_from_args``) reads it —

- ``all_reduce``: the whole buffer that is reduced;
- ``all_gather_into_tensor``: the *input*, i.e. this rank's shard (the output is world_size times larger);
- ``reduce_scatter_tensor``: the whole input (the output is one world_size-th of it).

:func:`logged` opens a window (it clears the logger first) and collects, per op, how many messages of
each size were sent inside it.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field

COMMS_LOGGER = {"enabled": True, "prof_all": True, "verbose": False, "debug": False}


def with_comms_logger(config: dict) -> dict:
    """A copy of ``config`` with DeepSpeed's comms logger on for every collective."""
    out = copy.deepcopy(config)
    out["comms_logger"] = dict(COMMS_LOGGER)
    return out


def messages() -> dict[str, dict[str, int]]:
    """The logger's content now: op → {message bytes (as a string, JSON-ready) → count}."""
    from deepspeed.comm.comm import comms_logger

    return {op: {str(size): int(vals[0]) for size, vals in sizes.items()}
            for op, sizes in comms_logger.get_raw_data().items()}


def timed() -> dict[str, list[list]]:
    """The logger's content now with the latency it logged for each message: op → [[message bytes, [ms, ...]]].

    Read them with care: in this DeepSpeed the logger reads each op's timer with ``elapsed(reset=False)``
    (``timed_op`` in ``deepspeed/comm/comm.py``), so every logged latency is the running total of all calls of
    that op since the process started, not the time of that call (notebook 11 shows it)."""
    from deepspeed.comm.comm import comms_logger

    return {op: [[int(size), [float(ms) for ms in vals[1]]] for size, vals in sizes.items()]
            for op, sizes in comms_logger.get_raw_data().items()}


def total_bytes(msgs: dict[str, dict[str, int]], min_bytes: int = 0) -> dict[str, int]:
    """op → sum of message bytes × count, counting only messages of at least ``min_bytes``."""
    return {op: sum(int(size) * n for size, n in sizes.items() if int(size) >= min_bytes)
            for op, sizes in msgs.items()}


@dataclass
class Window:
    """The messages logged between entering and leaving :func:`logged` (and their timings, see :func:`timed`)."""
    messages: dict = field(default_factory=dict)
    timed: dict = field(default_factory=dict)

    def bytes(self, min_bytes: int = 0) -> dict[str, int]:
        return total_bytes(self.messages, min_bytes)


@contextmanager
def logged():
    """Clear DeepSpeed's comms logger, run the block, and keep what it logged in the returned window."""
    from deepspeed import comm as dist

    dist.reset_log()
    window = Window()
    try:
        yield window
    finally:
        window.messages, window.timed = messages(), timed()
        dist.reset_log()
