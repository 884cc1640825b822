"""The README's notebook table and INSTRUCTORS.md's timing table, made from the manifest; the README's GPU table and
each notebook's "On GPUs" line, made from the notebooks' launches (:mod:`course_utils.tooling.gpu_table`); each
notebook's "Time to allow" line, made from the notebook and its run time (:mod:`course_utils.tooling.study_time`).

``python -m course_utils.tooling.tables`` says which table differs from what they make; ``--write`` rewrites them.
tests/test_manifest.py fails while one drifts.
"""
from __future__ import annotations

import argparse
import sys

from course_utils.tooling import gpu_table, instructors, routes, study_time, symptoms
from course_utils.tooling.manifest import README, README_BEGIN, README_END, between, full_rows, problems, readme_table

GPU_BEGIN = "<!-- GPU table: written by `python -m course_utils.tooling.tables --write` from the notebooks' launches -->"
GPU_END = "<!-- end of GPU table -->"


def _readme() -> str:
    text = between(README.read_text(), README_BEGIN, README_END, readme_table(), "README.md")
    text = between(text, routes.BEGIN, routes.END, routes.table(), "README.md")
    return between(text, GPU_BEGIN, GPU_END, gpu_table.readme_gpu_table(), "README.md")


def _guide() -> str:
    text = instructors.with_table(instructors.GUIDE.read_text(), instructors.render(full_rows()))
    return between(text, routes.BEGIN, routes.END, routes.table(), "INSTRUCTORS.md")


def tables_drift() -> list[str]:
    """Which generated tables differ from what the manifest makes (empty: all match)."""
    out = []
    if _readme() != README.read_text():
        out.append("README.md's notebook, paths or GPU table")
    out += [f"{stem}'s \"On GPUs\" line" for stem in gpu_table.box_drift()]
    out += [f"{stem}'s \"Time to allow\" line" for stem in study_time.box_drift()]
    if _guide() != instructors.GUIDE.read_text():
        out.append("INSTRUCTORS.md's timing or paths table")
    if symptoms.page_drift():
        out.append("notebooks/appendix/symptom_index.md")
    return out


def write_tables() -> list[str]:
    """Rewrite the README's and INSTRUCTORS.md's tables from the manifest; which ones changed."""
    changed = tables_drift()
    README.write_text(_readme())
    gpu_table.box_drift(write=True)
    study_time.box_drift(write=True)
    instructors.GUIDE.write_text(_guide())
    symptoms.write_page()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the README's and INSTRUCTORS.md's tables")
    a = parser.parse_args(argv)
    wrong = problems()
    for line in wrong:
        print(f"manifest: {line}")
    if a.write and not wrong:
        changed = write_tables()
        print("rewritten: " + (", ".join(changed) if changed else "nothing (both tables were up to date)"))
        return 0
    drift = tables_drift()
    for what in drift:
        print(f"{what} differs from the manifest: `python -m course_utils.tooling.tables --write` rewrites it")
    return 1 if wrong or drift else 0


if __name__ == "__main__":
    sys.exit(main())
