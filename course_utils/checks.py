"""Exercise checks: each fails with a hint that says what to look at, never silently passes.

In the student edition a solution is replaced by ``raise NotImplementedError()``; the checks turn
that into an :class:`ExerciseNotDone` with the same hint, so the learner sees what to do next.
"""
from __future__ import annotations

import math
from typing import Any, Callable


class ExerciseCheckError(AssertionError):
    """The exercise's answer is wrong; the message says what to change."""


class ExerciseNotDone(ExerciseCheckError):
    """The exercise still holds ``raise NotImplementedError()``."""


def _call(fn: Callable, args: tuple, hint: str) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        raise ExerciseNotDone(f"Exercise not done yet: replace `raise NotImplementedError()` in "
                              f"`{getattr(fn, '__name__', fn)}` with your code. Hint: {hint}") from None


def check(condition: bool, hint: str) -> None:
    """Fail with ``hint`` unless ``condition`` holds."""
    if not condition:
        raise ExerciseCheckError(hint)
    print("✔ check passed")


def check_close(actual: Any, expected: Any, hint: str, rel: float = 1e-6, abs_: float = 1e-9) -> None:
    """Numbers (or equal-length sequences of numbers) agree within a tolerance. A failure names what
    differs (the length, or the positions) but never the expected values."""
    a = list(actual) if isinstance(actual, (list, tuple)) else [actual]
    e = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    if len(a) != len(e):
        check(False, f"{hint} (you gave {len(a)} values; the check needs {len(e)})")
    wrong = [i for i, (x, y) in enumerate(zip(a, e))
             if not (isinstance(x, (int, float)) and math.isclose(x, y, rel_tol=rel, abs_tol=abs_))]
    where = "" if len(a) == 1 else f" at position{'s' if len(wrong) > 1 else ''} {wrong[:5]}{' …' if len(wrong) > 5 else ''}"
    check(not wrong, f"{hint} (your value{where} is off)")


def check_function(fn: Callable, cases: list[tuple[tuple, Any]], hint: str,
                   compare: Callable[[Any, Any], bool] | None = None) -> None:
    """Call ``fn(*args)`` for each case and compare with the expected value; a failure shows the case and
    the learner's answer, never the expected one."""
    same = compare or (lambda got, want: got == want)
    for args, want in cases:
        got = _call(fn, args, hint)
        if not same(got, want):
            raise ExerciseCheckError(f"{getattr(fn, '__name__', fn)}{args} returned {got!r}, which is not "
                                     f"right. Hint: {hint}")
    print(f"✔ check passed ({len(cases)} cases)")


def solution(fn: Callable, *args: Any, hint: str) -> Any:
    """Call an exercise function, turning an unsolved one into :class:`ExerciseNotDone`."""
    return _call(fn, args, hint)


def export_function(fn: Callable, path: "Path | str") -> str:
    """Write an exercise function's source to ``path`` so the launched ranks can import and run it.

    Notebook exercises that must run *inside* the ranks (a ring all-reduce, say) are written in the
    notebook as a function; the script receives this file's path and imports the function from it.
    Returns the path as a string (to pass as a script argument).
    """
    import inspect
    import textwrap
    from pathlib import Path

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("import torch\nimport torch.distributed as dist\n\n\n"
                      + textwrap.dedent(inspect.getsource(fn)))
    return str(target)


def launch_exercise(run: Callable[[], Any], hint: str) -> Any:
    """Run a launch that executes exercise code in the ranks; an unsolved exercise becomes
    :class:`ExerciseNotDone` (not a wall of rank tracebacks), any other failure is re-raised."""
    from .launch import LaunchError

    try:
        return run()
    except LaunchError as e:
        if "NotImplementedError" in str(e):
            raise ExerciseNotDone(f"Exercise not done yet: the ranks hit `raise NotImplementedError()`. "
                                  f"Hint: {hint}") from None
        raise
