"""A workshop with nbgrader: release the student notebooks, grade what participants hand in, with feedback.

``make release`` (``python -m course_utils.tooling.workshop release``) makes ``build/nbgrader/`` an nbgrader course folder:
its ``nbgrader_config.py`` (written here), ``source/<notebook>/`` (the course notebook: one assignment per
notebook), ``release/<notebook>/`` (what ``nbgrader generate_assignment`` makes of it: solutions cleared by
nbgrader's ClearSolutions with the course's stub, checks kept as locked, autograded one-point cells) and
``gradebook.db``.

``make grade SUBMISSIONS=<folder>`` autogrades a folder in nbgrader's layout,
``<folder>/<participant>/<notebook>/<notebook>.ipynb``, on a copy (``build/nbgrader/submitted/``; with ``--smoke``
each copy's ``parameters`` cell gets the tests' settings, as papermill injects them), writes
``build/nbgrader/grades.csv`` (participant × exercise → points), each participant's feedback as HTML
(``build/nbgrader/feedback/<participant>/<notebook>/``), and prints what each submission got and where it stopped.

nbgrader runs every cell with a time limit: a cell that runs longer is interrupted, shows a ``CellTimeoutError``,
and the cells after it run. :class:`GradeExecute` adds what nbgrader would otherwise turn into a submission without
any grade: a kernel that dies, or a cell that does not stop when interrupted. The cells after it are marked as not
run (an error each, so their checks score nothing) and the submission is graded as far as it got. The graded
notebooks' launches write under ``build/grading/``, never over the course's own ``build/runs`` and metrics.
"""
# The package (this docstring is also the command line's --help): .nbgrader_course (the course folder, its
# configuration, nbgrader's API, the release), .execute (GradeExecute, and what an executed notebook's cells show),
# .grading (collect, autograde, feedback, the gradebook CSV, the summary: grade()); __main__ is the command line.
from course_utils.tooling.workshop.execute import NOT_RUN, GradeExecute, problems_of, unscored_checks
from course_utils.tooling.workshop.grading import (SMOKE, Graded, autograde, collect, feedback, gradebook_table, grade,
    grading_build, handed_in, parameterize, summary, write_grades)
from course_utils.tooling.workshop.nbgrader_course import (CELL_TIMEOUT, CONFIG, COURSE_ID, STOP_WAIT, alembic_head,
    nbgrader_api, release, released, root, write_config)

__all__ = ["CELL_TIMEOUT", "CONFIG", "COURSE_ID", "NOT_RUN", "SMOKE", "STOP_WAIT", "GradeExecute", "Graded",
           "alembic_head", "autograde", "collect", "feedback", "grade", "gradebook_table", "grading_build", "handed_in",
           "nbgrader_api", "parameterize", "problems_of", "release", "released", "root", "summary", "unscored_checks",
           "write_config", "write_grades"]
