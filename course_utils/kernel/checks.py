"""Exercise checks: each fails with a hint that says what to look at, never silently passes.

In the student edition a solution is replaced by ``raise NotImplementedError()``; the checks turn
that into an :class:`ExerciseNotDone` with the same hint, so the learner sees what to do next.

Hints come in tiers: ``hint`` is one string or a sequence of them. The first failure of an exercise shows
the first (conceptual) hint, each further failure the next, more specific one; no tier shows the answer.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

STUB = "raise NotImplementedError()"
_failures: dict[str, int] = {}
_groups: list[int] = []          # open together() blocks, innermost last: how many checks each has seen pass


def hint_text(hint: "str | Sequence[str]", key: str | None = None, count: bool = True) -> str:
    """The tier of ``hint`` for this failure of exercise ``key`` (by default the first tier's text): the
    first failure gets the first tier, every further failure the next one, the last tier then stays.
    ``count=False`` (an exercise not attempted yet) shows the current tier without moving on."""
    tiers = [hint] if isinstance(hint, str) else list(hint)
    key = key or tiers[0]
    seen = _failures.get(key, 0)
    if not count:
        return tiers[min(seen, len(tiers) - 1)]
    _failures[key] = seen + 1
    text = tiers[min(seen, len(tiers) - 1)]
    if seen < len(tiers) - 1:
        text += " (a more specific hint comes if this check fails again)"
    return text


class ExerciseCheckError(AssertionError):
    """The exercise's answer is wrong; the message says what to change."""


class ExerciseNotDone(ExerciseCheckError):
    """The exercise still holds ``raise NotImplementedError()``."""


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", str(fn))


def _not_done(fn: Callable, hint: "str | Sequence[str]") -> ExerciseNotDone:
    return ExerciseNotDone(f"Exercise not done yet: replace `{STUB}` in `{_name(fn)}` with your code. "
                           f"Hint: {hint_text(hint, _name(fn), count=False)}")


def _call(fn: Callable, args: tuple, hint: "str | Sequence[str]") -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        raise _not_done(fn, hint) from None


_pending: list[str] = []         # ✔ lines of the cell running now, printed once it has run through


def _passed(line: str = "✔ check passed", checks: int = 1) -> None:
    """A check passed: its line, or, inside :func:`together`, one more for that block's summary.

    In a notebook the line waits for the end of the cell, and is printed only if the cell ran through: a cell whose
    first checks pass and whose next one fails shows the failure alone, not ✔ lines above an error (IPython's
    ``post_run_cell`` event). Outside IPython it is printed at once."""
    if _groups:
        _groups[-1] += checks
        return
    shell = _shell()
    if shell is None:
        print(line)
        return
    if _print_when_the_cell_ran not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _print_when_the_cell_ran)
    _pending.append(line)


def _shell() -> Any:
    import sys

    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _print_when_the_cell_ran(result: Any) -> None:
    lines = list(_pending)
    _pending.clear()
    if lines and getattr(result, "success", False):
        print("\n".join(lines))


@contextmanager
def together(what: str) -> Iterator[None]:
    """Several checks, one line: inside the block a passing check prints nothing, and at its end one line says how
    many passed and what they checked (``✔ 10 checks passed: <what>``; for one, ``✔ check passed: <what>``), where
    ten ``✔ check passed`` lines said nothing. A failing check still raises at once with its own message, and then no
    summary is printed. A block in a block counts its checks into the outer one. Outside a block every check prints
    its own line, as before::

        with checks.together("every rank's shard is as long as the others"):
            for shard in shards:
                checks.check(len(shard) == len(shards[0]), hint)
    """
    _groups.append(0)
    try:
        yield
    finally:
        passed = _groups.pop()
    if passed:
        _passed(f"✔ {f'{passed} checks' if passed > 1 else 'check'} passed: {what}", passed)


def check(condition: bool, hint: "str | Sequence[str]", key: str | None = None, said: str = "") -> None:
    """Fail with ``hint`` (its next tier on each failure of exercise ``key``) unless ``condition`` holds;
    ``said`` (what was wrong, never the answer) comes before the hint."""
    if not condition:
        raise ExerciseCheckError(f"{said} Hint: {hint_text(hint, key)}" if said else hint_text(hint, key))
    _passed()


def check_close(actual: Any, expected: Any, hint: "str | Sequence[str]", rel: float = 1e-6, abs_: float = 1e-9) -> None:
    """Numbers (or equal-length sequences of numbers) agree within a tolerance. A failure names what
    differs (the length, or the positions) but never the expected values."""
    a = list(actual) if isinstance(actual, (list, tuple)) else [actual]
    e = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    if len(a) != len(e):
        raise ExerciseCheckError(f"{hint_text(hint)} (you gave {len(a)} values; the check needs {len(e)})")
    wrong = [i for i, (x, y) in enumerate(zip(a, e))
             if not (isinstance(x, (int, float)) and math.isclose(x, y, rel_tol=rel, abs_tol=abs_))]
    where = "" if len(a) == 1 else f" at position{'s' if len(wrong) > 1 else ''} {wrong[:5]}{' …' if len(wrong) > 5 else ''}"
    if wrong:
        raise ExerciseCheckError(f"{hint_text(hint)} (your value{where} is off)")
    _passed()


def check_function(fn: Callable, cases: list[tuple[tuple, Any]], hint: "str | Sequence[str]",
                   compare: Callable[[Any, Any], bool] | None = None) -> None:
    """Call ``fn(*args)`` for each case and compare with the expected value; a failure shows the case and
    the learner's answer, never the expected one."""
    same = compare or (lambda got, want: got == want)
    for args, want in cases:
        got = _call(fn, args, hint)
        if not same(got, want):
            raise ExerciseCheckError(f"{_name(fn)}{args} returned {got!r}, which is not "
                                     f"right. Hint: {hint_text(hint, _name(fn))}")
    _passed(f"✔ check passed ({len(cases)} cases)")


def solution(fn: Callable, *args: Any, hint: "str | Sequence[str]") -> Any:
    """Call an exercise function, turning an unsolved one into :class:`ExerciseNotDone`."""
    return _call(fn, args, hint)


def outcome(fn: Callable, *args: Any, hint: "str | Sequence[str]", convert: Callable | None = None) -> Any:
    """Like :func:`solution`, but an exception the learner's code raises (or ``convert`` raises on its answer) is
    returned instead of raised: for a check that counts a failing answer as a wrong one. An unwritten exercise and
    the check's own refusals still raise."""
    try:
        answer = _call(fn, args, hint)
        return convert(answer) if convert is not None else answer
    except ExerciseCheckError:
        raise
    except Exception as err:          # noqa: BLE001 — an answer that fails is a wrong answer
        return err


def _measured(name: str, value: Any) -> bool:
    """Whether a notebook global holds what a launch measured: a launch's result, a table built from one, or
    IPython's record of the outputs the cells showed."""
    import pandas as pd

    from course_utils.kernel.launch.result import LaunchResult

    return isinstance(value, (LaunchResult, pd.DataFrame, pd.Series)) or name in ("Out", "_oh")


@contextmanager
def out_of_reach(fn: Callable, *names: str, hint: "str | Sequence[str] | None" = None, key: str | None = None,
                 instead: str = "") -> Iterator[set[str]]:
    """Inside the block, the globals of ``fn``'s namespace (the notebook's ``__main__``) that hold what a launch
    measured (a launch's result, a DataFrame or Series, the cells' outputs) and those called ``names`` are taken
    out of it, so that an exercise function the check calls cannot look the answer up; they are put back when the
    block ends, whatever happened in it. Yields their names. The check cell reads what it needs before the block.

    With a ``hint``, an error raised in the block because ``fn`` looked one of them up is the check's refusal of
    exercise ``key`` (saying which name, then ``instead``: what to do); any other error passes through."""
    namespace = getattr(fn, "__globals__", {})
    hidden = {name: namespace[name] for name in list(namespace) if name in names or _measured(name, namespace[name])}
    for name in hidden:
        del namespace[name]
    found = None
    try:
        yield set(hidden)
    except Exception as err:           # noqa: BLE001 — the learner's code; only a lookup of a hidden name is refused
        found = looked_up(err, set(hidden)) if hint is not None else None
        if found is None:
            raise
    finally:
        namespace.update(hidden)
    if found is not None:              # refused outside the except: the learner's NameError is not its context
        check(False, hint, key=key, said=f"your {_name(fn)} looked up `{found}`, which holds what a launch measured: "
                                         f"while the check calls it, that is out of its reach. {instead}".rstrip())


def looked_up(err: BaseException, hidden: "set[str]") -> str | None:
    """The name an exception raised inside :func:`out_of_reach` says was missing (NameError, KeyError of
    ``globals()[...]``, AttributeError of ``__main__.<name>``), when it is one of ``hidden``."""
    name = getattr(err, "name", None)
    if name is None and isinstance(err, KeyError) and err.args:
        name = err.args[0]
    return name if isinstance(name, str) and name in hidden else None


def is_done(fn: Callable) -> bool:
    """Whether an exercise function holds code of its own (not the student edition's stub)."""
    import inspect

    return STUB not in inspect.getsource(fn)


def require_done(fn: Callable, hint: "str | Sequence[str]") -> None:
    """Raise :class:`ExerciseNotDone` while ``fn`` still holds the stub (a check whose launch fell back to the
    course's own code must still fail until the learner writes theirs)."""
    if not is_done(fn):
        raise _not_done(fn, hint)


def answer_or(fn: Callable, *args: Any, fallback: Any, instead: str) -> Any:
    """The learner's answer ``fn(*args)`` once the exercise is written, else ``fallback`` and one line saying
    what happens ``instead``: the cells after an unsolved exercise go on with the course's answer, while the
    exercise's own check still fails."""
    if is_done(fn):
        return fn(*args)
    print(f"⏭  {_name(fn)} not written yet: {instead} (its check fails until you write yours)")
    return fallback


def export_done(fns: "Sequence[Callable]", folder: "Path | str", instead: str | None = None) -> list[str]:
    """Export the exercise functions the learner has written (one file each, see :func:`export_function`);
    for the others the ranks use the course's own code, or do what ``instead`` says, and one line says so."""
    from pathlib import Path

    missing = [_name(fn) for fn in fns if not is_done(fn)]
    if missing:
        instead = instead or f"the ranks use the course's version of {'it' if len(missing) == 1 else 'them'}"
        print(f"⏭  not written yet: {', '.join(missing)}; {instead} (its check below fails until you write yours)")
    return [export_function(fn, Path(folder) / f"{_name(fn)}.py") for fn in fns if is_done(fn)]


def export_function(fn: Callable, path: "Path | str", hint: "str | Sequence[str]" = "write the function first") -> str:
    """Write an exercise function's source to ``path`` so the launched ranks can import and run it.

    Notebook exercises that must run *inside* the ranks (a ring all-reduce, say) are written in the
    notebook as a function; the script receives this file's path and imports the function from it.
    Returns the path as a string (to pass as a script argument). A function that still holds the stub
    raises :class:`ExerciseNotDone` here, before any rank is started.
    """
    import inspect
    import textwrap
    from pathlib import Path

    if not is_done(fn):
        raise _not_done(fn, hint)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("import torch\nimport torch.distributed as dist\n\n\n"
                      + textwrap.dedent(inspect.getsource(fn)))
    return str(target)


def launch_exercise(run: Callable[[], Any], hint: "str | Sequence[str]") -> Any:
    """Run a launch that executes exercise code in the ranks; an unsolved exercise becomes
    :class:`ExerciseNotDone` (not a wall of rank tracebacks), a launch that fails or hangs with the learner's code
    becomes the check's refusal: the runner's account of the rank that failed first (or of where each rank waited),
    then the hint."""
    from course_utils.kernel.launch import LaunchError

    try:
        return run()
    except LaunchError as e:
        if "NotImplementedError" in str(e):
            raise ExerciseNotDone(f"Exercise not done yet: the ranks hit `{STUB}`. "
                                  f"Hint: {hint_text(hint, count=False)}") from None
        raise ExerciseCheckError(f"The ranks did not get through with your code:\n{e}\n"
                                 f"Hint: {hint_text(hint)}") from None
