"""The exercise checks: tiered hints, never the expected answer, and unsolved exercises caught before a launch."""
import pytest

from course_utils.kernel import checks

TIERS = ("think about what each rank holds", "rank r holds 1/N of the elements", "count the shards of rank 0")


def test_hints_get_more_specific_with_each_failure_and_stay_on_the_last():
    seen = []
    for _ in range(4):
        with pytest.raises(checks.ExerciseCheckError) as err:
            checks.check(False, TIERS, key="tiers-test")
        seen.append(str(err.value))
    assert [s.split(" (")[0] for s in seen] == [TIERS[0], TIERS[1], TIERS[2], TIERS[2]]
    assert "more specific hint" in seen[0] and "more specific hint" not in seen[3]


def test_a_failed_check_never_shows_the_expected_value():
    def answer(x):
        return x + 1

    with pytest.raises(checks.ExerciseCheckError) as err:
        checks.check_function(answer, [((1,), 987654)], hint="add one")
    assert "987654" not in str(err.value) and "returned 2" in str(err.value)
    with pytest.raises(checks.ExerciseCheckError) as err:
        checks.check_close(1.5, 123.25, hint="compare")
    assert "123.25" not in str(err.value)


def test_not_done_shows_the_first_tier_without_using_it_up():
    def stub(x):
        raise NotImplementedError()

    for _ in range(2):
        with pytest.raises(checks.ExerciseNotDone) as err:
            checks.solution(stub, 1, hint=("first", "second"))
        assert "Hint: first" in str(err.value)


def test_a_stub_is_not_exported_to_the_ranks(tmp_path):
    def ring(tensor):
        # YOUR CODE HERE
        raise NotImplementedError()

    def done(tensor):
        return tensor

    assert not checks.is_done(ring) and checks.is_done(done)
    with pytest.raises(checks.ExerciseNotDone):
        checks.export_function(ring, tmp_path / "ring.py")
    assert not (tmp_path / "ring.py").exists()
    assert checks.export_function(done, tmp_path / "done.py").endswith("done.py")


def test_cells_after_an_unsolved_exercise_run_on_the_course_answer(tmp_path, capsys):
    def fixed_config(broken):
        # YOUR CODE HERE
        raise NotImplementedError()

    def solved(broken):
        return {**broken, "stage": 2}

    course = {"stage": 1}
    assert checks.answer_or(fixed_config, {"stage": 0}, fallback=course, instead="this launch uses the course's config") is course
    line = capsys.readouterr().out
    assert line.startswith("⏭  fixed_config not written yet: this launch uses the course's config") and "check fails" in line
    assert checks.answer_or(solved, {"stage": 0}, fallback=course, instead="-") == {"stage": 2}
    assert capsys.readouterr().out == ""
    with pytest.raises(checks.ExerciseNotDone):          # its check still fails until the learner writes it
        checks.require_done(fixed_config, hint="write it")
    assert checks.export_done((fixed_config, solved), tmp_path) == [str(tmp_path / "solved.py")]
    assert "not written yet: fixed_config" in capsys.readouterr().out


def test_a_launch_that_fails_with_the_learners_code_is_the_checks_refusal():
    from course_utils.kernel.launch import LaunchError

    def failing(text):
        def run():
            raise LaunchError(text, result=None)
        return run

    with pytest.raises(checks.ExerciseNotDone):
        checks.launch_exercise(failing("Rank 1 failed:\nNotImplementedError"), hint="write it")
    with pytest.raises(checks.ExerciseCheckError) as refused:
        checks.launch_exercise(failing("Rank 1 failed (launch exit code 1):\nFileNotFoundError: vocabulary.txt"),
                               hint=("wait for rank 0", "a collective every rank reaches"))
    assert not isinstance(refused.value, checks.ExerciseNotDone)
    assert "Rank 1 failed" in str(refused.value) and "FileNotFoundError" in str(refused.value)
    assert "wait for rank 0" in str(refused.value)


def test_outcome_returns_what_the_learners_code_raised_and_lets_the_check_refuse():
    def fails(x):
        raise KeyError(x)

    def stub(x):
        raise NotImplementedError()

    assert checks.outcome(lambda x: [x], 3, hint="h", convert=tuple) == (3,)
    assert isinstance(checks.outcome(fails, "step", hint="h"), KeyError)
    assert isinstance(checks.outcome(lambda x: 5, 1, hint="h", convert=set), TypeError)    # set(5): a wrong answer too
    with pytest.raises(checks.ExerciseNotDone):
        checks.outcome(stub, 1, hint="h")


def test_in_a_notebook_the_passed_lines_wait_for_the_cell_and_a_failing_cell_shows_none(monkeypatch, capsys):
    """A cell whose first checks pass and whose next one fails printed ✔ lines above the error: in IPython the lines
    wait for the end of the cell (``post_run_cell``) and are printed only when it ran through."""
    from types import SimpleNamespace

    from IPython.core.events import EventManager, available_events

    shell = SimpleNamespace()
    shell.events = EventManager(shell, available_events)
    monkeypatch.setattr(checks, "_shell", lambda: shell)

    def cell(*conditions):
        try:
            for ok in conditions:
                checks.check(ok, "a hint")
        except checks.ExerciseCheckError:
            shell.events.trigger("post_run_cell", SimpleNamespace(success=False))
            return "raised"
        shell.events.trigger("post_run_cell", SimpleNamespace(success=True))
        return "ran"

    assert cell(True, True, False) == "raised" and capsys.readouterr().out == ""
    assert cell(True) == "ran" and capsys.readouterr().out == "✔ check passed\n"
    with checks.together("two things"):
        checks.check(True, "h")
        checks.check(True, "h")
    assert capsys.readouterr().out == ""
    shell.events.trigger("post_run_cell", SimpleNamespace(success=True))
    assert capsys.readouterr().out == "✔ 2 checks passed: two things\n"
    assert len(shell.events.callbacks["post_run_cell"]) == 1, "registered once"


def test_out_of_reach_hides_what_was_measured_and_refuses_a_lookup():
    import pandas as pd

    from course_utils.kernel import checks

    namespace = {"measured": pd.DataFrame({"a": [1]}), "held_out": [3], "kept": 5}
    exec("def answer():\n    return held_out[0] + kept", namespace)
    with pytest.raises(checks.ExerciseCheckError, match="looked up `held_out`.*Work it out"):
        with checks.out_of_reach(namespace["answer"], "held_out", hint="hint", key="answer", instead="Work it out."):
            namespace["answer"]()
    assert namespace["held_out"] == [3] and "measured" in namespace, "put back after the refusal"
    with pytest.raises(ZeroDivisionError):       # any other error is the learner's own, passed through
        with checks.out_of_reach(namespace["answer"], hint="hint", key="answer"):
            1 / 0
    with checks.out_of_reach(namespace["answer"], "held_out") as hidden:   # no hint: the caller says what it wants
        assert hidden == {"measured", "held_out"} and "kept" in namespace
