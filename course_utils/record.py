"""Figures recorded by the scripts that the launcher runs, one JSON line each.

A script calls ``record("loss", 0.42)`` on any rank. Under ``course_utils.launch`` the line goes to
the run folder (``$COURSE_RUN_DIR/metrics/rank<r>.jsonl``) and comes back in ``result.metrics``;
run from a terminal, the figure is printed instead so nothing is lost.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """Tensors, numpy values and paths as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def rank() -> int:
    """This process's global rank as the launcher set it (0 outside a launch)."""
    return int(os.environ.get("RANK", "0"))


def record(name: str, value: Any) -> None:
    """Record one figure from this rank."""
    line = json.dumps({"name": name, "value": _plain(value), "rank": rank()})
    run_dir = os.environ.get("COURSE_RUN_DIR")
    if not run_dir:
        print(f"[record rank {rank()}] {name} = {json.dumps(_plain(value))}", flush=True)
        return
    folder = Path(run_dir) / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"rank{rank()}.jsonl", "a") as f:
        f.write(line + "\n")


def read_records(run_dir: Path) -> list[dict]:
    """All records of a run, in rank order then in the order each rank wrote them."""
    records = []
    files = sorted((Path(run_dir) / "metrics").glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records
