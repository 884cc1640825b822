"""Figures recorded by the scripts that the launcher runs, one JSON line each, and how they are read back.

A script calls ``record("loss", 0.42)`` on any rank. Under ``course_utils.kernel.launch`` the line goes to
the run folder (``$COURSE_RUN_DIR/metrics/rank<r>.jsonl``) and comes back in ``result.records``;
run from a terminal, the figure is printed instead so nothing is lost.

A record with a fixed structure is declared once, as a dataclass deriving from :class:`Record` that
carries the record's name (``class Rung(Record, name="rung")``), in :mod:`course_utils.common.records`.
The script writes an instance (``record(rung)``), the notebook reads instances back with
:func:`read_as` (``read_as(result.records, Rung)``), and the tests read a notebook's recorded ones with
:func:`as_records`: no side spells the keys out again.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from course_utils.common import run_folder

_NO_VALUE = object()


class Record:
    """Base of the declared records: a dataclass whose class variable ``NAME`` is its record name.

    ``@dataclass class Rung(Record, name="rung"): ...`` sets ``Rung.NAME = "rung"``.
    """
    NAME: ClassVar[str]

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.NAME = name


R = TypeVar("R", bound=Record)


def plain(value: Any) -> Any:
    """Tensors, numpy values, paths and dataclasses as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def rank() -> int:
    """This process's global rank as the launcher set it (0 outside a launch)."""
    return int(os.environ.get("RANK", "0"))


def record(name: str | Record, value: Any = _NO_VALUE) -> None:
    """Record one figure from this rank: ``record("loss", 0.42)``, or ``record(rung)`` for a declared
    :class:`Record` (its class names it). A value may also be a list of declared records (rows)."""
    if value is _NO_VALUE:
        if not isinstance(name, Record):
            raise TypeError(f"record({name!r}) needs a value, or an instance of a declared Record")
        name, value = name.NAME, name
    line = json.dumps({"name": name, "value": plain(value), "rank": rank()})
    run_dir = run_folder.current()
    if run_dir is None:
        print(f"[record rank {rank()}] {name} = {json.dumps(plain(value))}", flush=True)
        return
    path = run_folder.metrics_file(run_dir, rank())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def read_records(run_dir: Path) -> list[dict]:
    """All records of a run, in rank order then in the order each rank wrote them."""
    records = []
    for path in run_folder.metrics_files(run_dir):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def read_as(records: list[dict], cls: type[R], rank: int | None = 0) -> list[R]:
    """The ``cls.NAME`` records of rank ``rank`` (every rank with ``rank=None``) as ``cls`` instances,
    in rank order then in the order they were written. A record holding a list gives one instance
    per element. A key the declaration does not have (or a missing one) raises ``TypeError``."""
    out = []
    for r in records:
        if r["name"] == cls.NAME and (rank is None or r["rank"] == rank):
            out += as_records(r["value"], cls)
    return out


def as_records(values: Any, cls: type[R]) -> list[R]:
    """Declared records as a notebook recorded them among its figures (``nb.record(ladder=rungs)`` writes each
    as its fields) back as ``cls`` instances: a list gives one instance per element, one mapping a list of one.
    The tests read a notebook's figures with it, so the keys stay spelled in the declaration only."""
    return [cls(**v) for v in (values if isinstance(values, list) else [values])]
