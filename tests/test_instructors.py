"""INSTRUCTORS.md's timing table: generated from the report `make course` writes, never typed in."""
from pathlib import Path

import pytest

from course_utils.tooling import course, instructors, manifest, study_time
from course_utils.common import paths


def _report() -> str:
    """A report as `make course` writes it: 00 alone, 01 and 02 side by side, 02 failed."""
    outcomes = [course.Outcome("00_setup_and_first_launch", True, 35.4, Path("x"), started=0, ended=35),
                course.Outcome("01_distributed_concepts", True, 61.0, Path("x"), started=40, ended=101),
                course.Outcome("02_first_deepspeed_loop", False, 125.0, Path("x"), error="boom", started=50, ended=175)]
    return course.report(outcomes)


def test_the_table_is_the_reports_times_with_planning_slots():
    table = instructors.timing_table(_report(), counts={"00_setup_and_first_launch": 2,
                                                        "01_distributed_concepts": 2, "02_first_deepspeed_loop": 3})
    lines = table.splitlines()
    alone = {name: study_time.alone_minutes(paths.NOTEBOOKS / f"{name}.ipynb", seconds)
             for name, seconds in (("00_setup_and_first_launch", 35), ("01_distributed_concepts", 61), ("02_first_deepspeed_loop", 125))}
    assert lines[2] == f"| 00_setup_and_first_launch | 0 min 35 s | 2 | 40 min | {alone['00_setup_and_first_launch']} min |"      # 15 + 2 × 10 + 0.6 → 40
    assert lines[3] == f"| 01_distributed_concepts | 1 min 01 s * | 2 | 40 min | {alone['01_distributed_concepts']} min |"      # ran beside 02: starred
    assert lines[4] == f"| 02_first_deepspeed_loop | 2 min 05 s * (FAILED in that run) | 3 | 50 min | {alone['02_first_deepspeed_loop']} min |"
    assert lines[5].startswith("| **all, one after another** | 3 min 41 s | 7 | 2 h 10 min |")


def test_the_time_alone_grows_with_the_text_the_code_the_exercises_and_the_run(tmp_path):
    import nbformat

    source = paths.NOTEBOOKS / "00_setup_and_first_launch.ipynb"
    base = study_time.alone_minutes(source, 30)
    assert study_time.alone_minutes(source, 30 + 600) == base + 10          # ten more minutes of runs
    nb = nbformat.read(str(source), as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("word " * 1000))         # ten minutes more to read at 100 a minute
    longer = tmp_path / source.name
    nbformat.write(nb, str(longer))
    assert study_time.alone_minutes(longer, 30) == base + 10
    recorded = manifest.entry(source.stem)["full_seconds"]
    assert study_time.box_line(source).startswith(f"{study_time.BOX_PREFIX} about {study_time.alone_minutes(source, recorded)} min")
    with pytest.raises(ValueError, match="make course"):
        instructors.timing_table("# an empty report\n", counts={})


def test_the_guide_keeps_its_text_and_gets_the_table_between_its_markers(tmp_path):
    guide = tmp_path / "INSTRUCTORS.md"
    guide.write_text(f"intro\n{instructors.BEGIN}\nold table\n{instructors.END}\noutro\n")
    report, manifest = tmp_path / "report.md", tmp_path / "manifest.toml"
    report.write_text(_report())
    manifest.write_text(paths.NOTEBOOKS.joinpath("manifest.toml").read_text())
    assert instructors.update(report, guide, manifest) is True
    text = guide.read_text()
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old table" not in text
    assert "| 00_setup_and_first_launch | 0 min 35 s |" in text
    assert "full_seconds = 35\nfull_beside = false" in manifest.read_text()     # the run's times, in the manifest
    assert instructors.update(report, guide, manifest) is False          # already up to date: unchanged
    with pytest.raises(ValueError, match="markers"):
        instructors.with_table("no markers here", "table")


def test_the_committed_guide_lists_every_notebook_with_its_exercises():
    """The committed table comes from a full run of the course as it is: every notebook, its exercise count."""
    text = instructors.GUIDE.read_text()
    table = text.split(instructors.BEGIN, 1)[1].split(instructors.END, 1)[0]
    counts = instructors.exercise_counts()
    assert sorted(counts) == sorted(nb.stem for nb in paths.NOTEBOOKS.glob("*.ipynb"))
    for name, n in counts.items():
        assert f"| {name} | " in table and f" | {n} | " in table.split(f"| {name} | ", 1)[1].splitlines()[0], name


def test_a_full_run_writes_the_table_under_build_and_leaves_the_guide_alone(tmp_path):
    """make course never edits a tracked file: the table goes to build/, `make instructors` copies it."""
    report, guide, manifest = tmp_path / "report.md", tmp_path / "INSTRUCTORS.md", tmp_path / "manifest.toml"
    report.write_text(_report())
    manifest.write_text(paths.NOTEBOOKS.joinpath("manifest.toml").read_text())
    guide.write_text(f"intro\n{instructors.BEGIN}\nold table\n{instructors.END}\n")
    before = guide.read_text()
    assert instructors.write_table(report, guide, manifest) is True           # differs from the guide's
    assert guide.read_text() == before
    assert (tmp_path / instructors.TABLE).read_text().startswith("| notebook |")
    instructors.update(report, guide, manifest)
    assert instructors.write_table(report, guide, manifest) is False          # once copied, the same table
