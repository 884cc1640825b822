"""What a launch hands back: :class:`LaunchResult` on success, :class:`LaunchError` on failure.

A failed launch still carries its full result (logs of every rank, the records written before the
failure), so a notebook can show what happened without digging through the run folder.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LaunchResult:
    returncode: int
    log: str                      # everything the launch printed, rank-prefixed (hidden chatter included)
    records: list[dict]           # every record() call: {"name", "value", "rank"}
    run_dir: Path
    command: str                  # the equivalent shell command
    seconds: float
    world_size: int
    rank_logs: dict[int, str] = field(default_factory=dict)
    hidden_lines: int = 0         # lines kept in the log but not streamed (launcher/library chatter)
    stacks: dict[int, str] = field(default_factory=dict)   # on a timeout: each rank's Python stacks (faulthandler)

    @property
    def metrics(self) -> dict[str, Any]:
        """name → value, from the lowest rank that recorded it (the last value if recorded twice)."""
        out: dict[str, Any] = {}
        for rec in sorted(self.records, key=lambda r: -r["rank"]):   # stable: keeps each rank's order
            out[rec["name"]] = rec["value"]
        return out

    def per_rank(self, name: str) -> dict[int, Any]:
        """rank → value of ``name`` (the last one each rank recorded)."""
        return {rec["rank"]: rec["value"] for rec in self.records if rec["name"] == name}

    def series(self, name: str, rank: int = 0) -> list[Any]:
        """Every value of ``name`` recorded by ``rank``, in order (a loss curve, say)."""
        return [rec["value"] for rec in self.records if rec["name"] == name and rec["rank"] == rank]


class LaunchError(RuntimeError):
    """A launch that failed or timed out; ``.result`` holds the logs of every rank."""

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


class CommandError(RuntimeError):
    """A single-process tool (:func:`course_utils.kernel.launch.command`) that failed or timed out.

    A ``RuntimeError`` as the docstring of ``command`` always promised, so ``except RuntimeError``
    keeps working; ``.output`` holds everything the tool printed before it ended or was killed.
    """

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output
