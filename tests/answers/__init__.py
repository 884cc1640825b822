"""Every exercise answered wrong on purpose: once as a learner who **copies** (the nearest formula, call, config or
printed value on the page, or in a course module the notebook imports) and once as one who **misunderstands**.

Each notebook has a module here, ``nbNN.py``, whose ``ANSWERS`` maps each exercise function to :func:`wrong`.
The notebook's test replays every declared answer in the kernel that has just run the notebook (``conftest.REPLAY``):
the answer's source replaces the exercise cell, the check runs again, and the test requires a refusal
(:class:`~course_utils.kernel.checks.ExerciseCheckError`, not "not done yet") whose message and printed output hold
none of the exercise's ``secret`` strings nor a line of its solution. ``test_manifest`` refuses an exercise without
both answers. Exercises whose checks read one launch may be replayed together (a module's ``TOGETHER``, see
:func:`together`): one launch per kind of answer, each check refusing its own exercise.
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
    says: str = ""       # text the refusal must hold, where the check refuses this answer in a branch of its own


@dataclass(frozen=True)
class Wrong:
    answers: tuple[Answer, ...]
    run: str = "check"                 # cells run after the answer: the check cell, or every cell from the exercise to it
    launches: bool = False             # whether the check launches ranks (a trial then costs a launch)
    secret: tuple[str, ...] = field(default_factory=tuple)   # text the refusal must not show (the expected values)

    def of(self, kind: str) -> list[Answer]:
        return [a for a in self.answers if a.kind == kind]


def wrong(copier: "tuple | list[tuple]", misread: "tuple | list[tuple]",
          run: str = "check", launches: bool = False, secret: "tuple[str, ...] | list[str]" = ()) -> Wrong:
    """``copier`` and ``misread``: ``(why, source)`` or ``(why, source, says)``, or a list of them; ``source``
    replaces the exercise cell, ``says`` is text its refusal must hold."""
    assert run in RUN, run
    answers = []
    for kind, given in (("copier", copier), ("misread", misread)):
        for why, source, *says in ([given] if isinstance(given, tuple) else given):
            answers.append(Answer(kind, why.strip(), textwrap.dedent(source).strip() + "\n", *says))
    return Wrong(tuple(answers), run, launches, tuple(secret))


def _module(notebook: str):
    try:
        return importlib.import_module(f"answers.nb{notebook[:2]}")
    except ModuleNotFoundError:
        return None


def load(notebook: str) -> dict[str, Wrong]:
    """The declared wrong answers of notebook ``notebook`` (its name or its two-digit prefix); {} when it has none."""
    module = _module(notebook)
    return dict(module.ANSWERS) if module else {}


def together(notebook: str) -> list[tuple[str, ...]]:
    """Exercises whose checks read one and the same launch (a module's ``TOGETHER``): the replay gives that launch
    the answers of one kind for all of them at once, as a learner who copies copies every answer, and requires each
    check to refuse its own exercise. One launch per kind instead of one per answer; each exercise's answers of a
    kind pair up in order, so there must be as many of them."""
    module = _module(notebook)
    groups = [tuple(g) for g in getattr(module, "TOGETHER", ())] if module else []
    declared = load(notebook)
    for group in groups:
        for kind in KINDS:
            counts = {name: len(declared[name].of(kind)) for name in group}
            assert len(set(counts.values())) == 1, f"{notebook}: {kind} answers of {group} do not pair up: {counts}"
        assert all(declared[name].launches and declared[name].run == "from_solution" for name in group), \
            f"{notebook}: the exercises of {group} must each launch, run from the solution"
    return groups
