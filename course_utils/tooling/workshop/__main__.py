"""``python -m course_utils.tooling.workshop release|grade``: the command line of ``make release`` and ``make grade``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_utils.common import paths
from course_utils.tooling.workshop import __doc__ as OVERVIEW
from course_utils.tooling.workshop.grading import grade
from course_utils.tooling.workshop.nbgrader_course import CELL_TIMEOUT, release, root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tooling.workshop", description=OVERVIEW,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="generate the student assignments with nbgrader")
    rel.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 00 05")
    gra = sub.add_parser("grade", help="autograde a folder <participant>/<notebook>/<notebook>.ipynb")
    gra.add_argument("submissions", type=Path)
    gra.add_argument("--smoke", action="store_true", help="run the submissions with the smoke parameters (SMOKE=True)")
    gra.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help=f"seconds per cell (default {CELL_TIMEOUT})")
    a = parser.parse_args(argv)
    if a.command == "release":
        for path in release(a.only):
            print(f"released {paths.relative(path)}")
        print(f"nbgrader course folder: {paths.relative(root())} (gradebook.db, nbgrader_config.py)")
        return 0
    if not a.submissions.is_dir():
        parser.error(f"SUBMISSIONS={a.submissions} is not a folder of <participant>/<notebook>/<notebook>.ipynb")
    return 1 if any(r.error for r in grade(a.submissions, a.smoke, a.timeout)) else 0


if __name__ == "__main__":
    sys.exit(main())
