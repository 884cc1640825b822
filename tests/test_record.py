"""Records: written by a rank, read back through the dataclass that declares them."""
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from course_utils.common.record import Record, plain, read_as, read_records, record


@dataclass
class Point(Record, name="point"):
    x: int
    y: float = 0.0


def _write(monkeypatch, run_dir: Path, rank: int, *calls) -> None:
    monkeypatch.setenv("COURSE_RUN_DIR", str(run_dir))
    monkeypatch.setenv("RANK", str(rank))
    for args in calls:
        record(*args)


def test_declared_records_round_trip_by_rank(tmp_path, monkeypatch):
    _write(monkeypatch, tmp_path, 1, (Point(3, 1.5),), ("loss", torch.tensor(0.25)))
    _write(monkeypatch, tmp_path, 0, (Point(1),), (Point(2, 2.0),), (Point.NAME, [Point(7), Point(8)]))
    records = read_records(tmp_path)
    assert [r["rank"] for r in records] == [0, 0, 0, 1, 1], "rank order, then write order"
    assert read_as(records, Point) == [Point(1), Point(2, 2.0), Point(7), Point(8)], "a list record gives one per element"
    assert read_as(records, Point, rank=1) == [Point(3, 1.5)]
    assert len(read_as(records, Point, rank=None)) == 5
    assert next(r for r in records if r["name"] == "loss")["value"] == 0.25


def test_a_record_that_does_not_match_its_declaration_fails_loudly():
    with pytest.raises(TypeError):
        read_as([{"name": "point", "rank": 0, "value": {"x": 1, "z": 2}}], Point)
    with pytest.raises(TypeError, match="needs a value"):
        record("point")


def test_plain_values_and_terminal_output(capsys, monkeypatch):
    monkeypatch.delenv("COURSE_RUN_DIR", raising=False)
    assert plain({"p": Path("/a"), "t": torch.tensor([1, 2]), "d": Point(1)}) == {"p": "/a", "t": [1, 2],
                                                                                  "d": {"x": 1, "y": 0.0}}
    record(Point(4))
    assert '[record rank 0] point = {"x": 4, "y": 0.0}' in capsys.readouterr().out


def test_every_record_name_is_declared_once():
    """Record classes wherever they are declared (the declarations, the rank modules, the scripts): one class per
    record name, and every one of them in course_utils/common/records/."""
    import importlib
    import inspect

    from course_utils.common import paths
    from script_modules import load_script

    modules = [importlib.import_module(f"course_utils.rank.{p.stem}") for p in (paths.ROOT / "course_utils" / "rank").glob("*.py")]
    modules += [load_script(p.stem) for p in sorted(paths.SCRIPTS.glob("[0-9]*.py"))]
    modules += [importlib.import_module(f"course_utils.common.records.{p.stem}")
                for p in sorted((paths.ROOT / "course_utils" / "common" / "records").glob("[!_]*.py"))]
    declared = {}
    for module in modules:
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, Record) and cls is not Record and cls.__module__ == module.__name__:
                assert cls.NAME not in declared, f"{cls.NAME!r} declared by {declared.get(cls.NAME)} and {cls}"
                assert cls.__module__.startswith("course_utils.common.records."), f"{cls} is declared outside common/records/"
                declared[cls.NAME] = cls
    assert {"rung", "zero_memory", "bucket", "ring", "trace", "combo", "optimizer", "lr_curve", "collectives",
            "auto_fills", "engine_view", "generation"} <= set(declared)
