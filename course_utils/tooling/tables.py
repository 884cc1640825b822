"""The README's notebook table and INSTRUCTORS.md's timing table, made from the manifest.

``python -m course_utils.tooling.tables`` says which table differs from what ``notebooks/manifest.toml`` makes;
``--write`` rewrites both. tests/test_manifest.py fails while one drifts.
"""
from __future__ import annotations

import argparse
import sys

from course_utils.tooling import instructors
from course_utils.tooling.manifest import README, README_BEGIN, README_END, between, full_rows, problems, readme_table


def tables_drift() -> list[str]:
    """Which generated tables differ from what the manifest makes (empty: all match)."""
    out = []
    if between(README.read_text(), README_BEGIN, README_END, readme_table(), "README.md") != README.read_text():
        out.append("README.md's notebook table")
    guide = instructors.GUIDE.read_text()
    if instructors.with_table(guide, instructors.render(full_rows())) != guide:
        out.append("INSTRUCTORS.md's timing table")
    return out


def write_tables() -> list[str]:
    """Rewrite the README's and INSTRUCTORS.md's tables from the manifest; which ones changed."""
    changed = tables_drift()
    README.write_text(between(README.read_text(), README_BEGIN, README_END, readme_table(), "README.md"))
    instructors.GUIDE.write_text(instructors.with_table(instructors.GUIDE.read_text(), instructors.render(full_rows())))
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
