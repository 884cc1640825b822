"""Every exercise answered wrong on purpose: once as a learner who **copies** (the nearest formula, call, config or
printed value on the page, or in a course module the notebook imports) and once as one who **misunderstands**.

Each notebook has a module here, ``nbNN.py``, whose ``ANSWERS`` maps each exercise function to :func:`wrong`.
The notebook's test replays every declared answer in the kernel that has just run the notebook (``conftest.REPLAY``):
the answer's source replaces the exercise cell, the check runs again, and the test requires a refusal
(:class:`~course_utils.kernel.checks.ExerciseCheckError`, not "not done yet") whose message and printed output hold
none of the exercise's ``secret`` strings nor a line of its solution. ``test_manifest`` refuses an exercise without
both answers.
"""
from __future__ import annotations

import importlib
import textwrap
from dataclasses import dataclass, field

KINDS = ("copier", "misread")
RUN = ("check", "from_solution")


@dataclass(frozen=True)
class Answer:
    kind: str            # "copier" or "misread"
    why: str             # what the learner did, in one sentence
    source: str          # the exercise cell's whole source as that learner wrote it


@dataclass(frozen=True)
class Wrong:
    answers: tuple[Answer, ...]
    run: str = "check"                 # cells run after the answer: the check cell, or every cell from the exercise to it
    launches: bool = False             # whether the check launches ranks (a trial then costs a launch)
    secret: tuple[str, ...] = field(default_factory=tuple)   # text the refusal must not show (the expected values)

    def of(self, kind: str) -> list[Answer]:
        return [a for a in self.answers if a.kind == kind]


def wrong(copier: "tuple[str, str] | list[tuple[str, str]]", misread: "tuple[str, str] | list[tuple[str, str]]",
          run: str = "check", launches: bool = False, secret: "tuple[str, ...] | list[str]" = ()) -> Wrong:
    """``copier`` and ``misread``: ``(why, source)`` or a list of them; ``source`` replaces the exercise cell."""
    assert run in RUN, run
    answers = []
    for kind, given in (("copier", copier), ("misread", misread)):
        for why, source in ([given] if isinstance(given, tuple) else given):
            answers.append(Answer(kind, why.strip(), textwrap.dedent(source).strip() + "\n"))
    return Wrong(tuple(answers), run, launches, tuple(secret))


def load(notebook: str) -> dict[str, Wrong]:
    """The declared wrong answers of notebook ``notebook`` (its name or its two-digit prefix); {} when it has none."""
    try:
        module = importlib.import_module(f"answers.nb{notebook[:2]}")
    except ModuleNotFoundError:
        return {}
    return dict(module.ANSWERS)
