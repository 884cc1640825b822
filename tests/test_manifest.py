"""The manifest (notebooks/manifest.toml) lists every notebook; the tables made from it match it."""
from pathlib import Path

import pytest

from course_utils.tooling import course, manifest, study_time, tables
from course_utils.common import paths


def test_every_notebook_has_an_entry_and_every_entry_a_notebook():
    assert manifest.problems() == []


def test_a_notebook_without_an_entry_is_named(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for stem in ("00_a", "01_b"):
        (notebooks / f"{stem}.ipynb").write_text("{}")
    toml = tmp_path / "manifest.toml"
    toml.write_text('[notebook.00_a]\ntitle = "a"\nwhat_you_do = "x"\nranks = 2\nsmoke_seconds = 5\n'
                    'full_seconds = 9\nfull_beside = false\n\n[notebook.02_c]\ntitle = 3\ncolour = "red"\n')
    wrong = manifest.problems(toml, notebooks)
    assert "01_b: no entry in manifest.toml" in wrong
    assert "02_c: an entry in manifest.toml but no notebook" in wrong
    assert "02_c: title missing or not str" in wrong and "02_c: unknown field 'colour'" in wrong
    assert not [w for w in wrong if w.startswith("00_a")]
    with pytest.raises(KeyError, match="no entry"):
        manifest.entry("01_b", toml)


def test_the_readme_and_instructors_tables_are_made_from_it():
    assert tables.tables_drift() == [], "run `python -m course_utils.tooling.tables --write`"


def test_a_full_runs_times_go_into_the_manifest_with_its_comments_kept(tmp_path):
    toml = tmp_path / "manifest.toml"
    toml.write_text(paths.NOTEBOOKS.joinpath("manifest.toml").read_text())
    rows = [{"notebook": "03_zero_stages", "ok": True, "seconds": 77, "beside": []},
            {"notebook": "12_adapters_under_zero", "ok": True, "seconds": 21, "beside": ["03_zero_stages"]}]
    assert manifest.record_full_run(rows, toml) is True
    assert manifest.full_seconds(toml)["03_zero_stages"] == 77 and manifest.full_seconds(toml)["12_adapters_under_zero"] == 21
    assert manifest.load(toml)["03_zero_stages"]["full_beside"] is False
    assert manifest.load(toml)["12_adapters_under_zero"]["full_beside"] is True
    untouched = {k: v for k, v in manifest.full_seconds(toml).items() if k not in ("03_zero_stages", "12_adapters_under_zero")}
    assert untouched == {k: v for k, v in manifest.full_seconds().items() if k in untouched}
    assert toml.read_text().startswith("# One entry per notebook")
    assert manifest.record_full_run(rows, toml) is False
    with pytest.raises(KeyError, match="no entry"):
        manifest.record_full_run([{"notebook": "99_new", "ok": True, "seconds": 1, "beside": []}], toml)


def test_the_runner_reads_which_notebooks_run_alone_from_it():
    alone = {nb.stem for nb in paths.NOTEBOOKS.glob("*.ipynb") if course.runs_alone(nb)}
    assert alone == {stem for stem, e in manifest.load().items() if e.get("runs_alone")}
    assert {"04_offload_and_infinity", "10_capstone_translation"} <= alone


def _closing_problems(notebooks=paths.NOTEBOOKS) -> list[str]:
    """Each notebook's last cell must link the next notebook of the manifest (the last one: the decision sheet)."""
    import nbformat

    stems = list(manifest.load())
    found = []
    for stem, after in zip(stems, [*stems[1:], None]):
        closing = nbformat.read(str(notebooks / f"{stem}.ipynb"), as_version=4).cells[-1].source
        target = f"({after}.ipynb)" if after else "(appendix/decision_sheet.md)"
        if target not in closing:
            found.append(f"{stem}: its last cell does not link {target[1:-1]}")
    return found


def test_each_notebook_ends_with_a_link_to_the_next_one():
    assert _closing_problems() == []


def test_a_notebook_that_ends_elsewhere_is_named(tmp_path):
    import shutil

    import nbformat

    for nb in paths.NOTEBOOKS.glob("*.ipynb"):
        shutil.copy(nb, tmp_path / nb.name)
    first = sorted(tmp_path.glob("*.ipynb"))[0]
    nb = nbformat.read(str(first), as_version=4)
    nb.cells[-1].source = "Back to the start."
    nbformat.write(nb, str(first))
    assert [p for p in _closing_problems(tmp_path) if p.startswith(first.stem)]


def declared_gaps(notebook: Path) -> list[str]:
    """What the exercises of ``notebook`` lack of the rule: a check cell, and wrong answers declared in tests/answers
    (a copier's and a misunderstanding's, each saying what the learner did and defining the exercise's function)."""
    import re

    import nbformat

    import answers
    from course_utils.tooling.student import exercises

    declared = answers.load(notebook.stem)
    gaps = []
    for ex in exercises(nbformat.read(str(notebook), as_version=4)):
        name = ex["name"]
        if ex["check"] is None:
            gaps.append(f"{name}: no check cell hands it to a checks call")
        wrong = declared.get(name)
        if wrong is None:
            gaps.append(f"{name}: no wrong answers declared in tests/answers/nb{notebook.stem[:2]}.py")
            continue
        for kind in answers.KINDS:
            given = wrong.of(kind)
            if not given:
                gaps.append(f"{name}: no {kind} answer")
            for a in given:
                if len(a.why) < 15 or not re.search(rf"^def {name}\(", a.source, re.M):
                    gaps.append(f"{name}: its {kind} answer must say what the learner did and define {name}()")
    gaps += [f"{name}: declared, but the notebook has no such exercise" for name in
             set(declared) - {ex["name"] for ex in exercises(nbformat.read(str(notebook), as_version=4))}]
    return gaps


def test_every_exercise_declares_a_copiers_and_a_misunderstandings_answer():
    gaps = {nb.stem: declared_gaps(nb) for nb in sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))}
    gaps = {k: v for k, v in gaps.items() if v}
    assert not gaps, "exercises without their wrong answers (see tests/answers/__init__.py):\n" + \
        "\n".join(f"{k}: {g}" for k, v in gaps.items() for g in v)


def test_an_exercise_without_its_wrong_answers_is_named(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def guess(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"),
        nbformat.v4.new_code_cell("checks.check_function(guess, [((1,), 1)], hint='h')")])
    path = tmp_path / "99_new.ipynb"
    nbformat.write(nb, str(path))
    assert declared_gaps(path) == ["guess: no wrong answers declared in tests/answers/nb99.py"]


def test_exercises_replayed_together_get_one_launch_per_kind_with_every_check_and_no_exercise_cell():
    """answers.together: the replay sets all the group's answers of a kind, runs the cells from the first exercise to
    the last check once, leaving out the group's exercise cells (they would put a solution back), and reads each
    member's check among them."""
    import nbformat

    import answers
    from conftest import grouped_trials
    from course_utils.tooling.student import exercises

    grouped = 0
    for path in sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        groups = answers.together(path.stem)
        if not groups:
            continue
        nb = nbformat.read(str(path), as_version=4)
        nb.metadata["course_name"] = path.stem
        found = {ex["name"]: ex for ex in exercises(nb)}
        assert grouped_trials(nb, launches=False) == []          # COURSE_TRIALS=kernel: no launch
        for names, solutions, trials in grouped_trials(nb, launches=True):
            assert solutions == [nb.cells[found[n]["cell"]].source for n in names]
            assert {t[0] for t in trials} == set(answers.KINDS)
            for kind, whys, sources, cells, checks in trials:
                assert len(whys) == len(sources) == len(names) and sorted(checks.values()) == sorted(names)
                assert all(cells[i] == nb.cells[found[n]["check"]].source for i, n in checks.items())
                assert not set(cells) & set(solutions), "an exercise cell of the group would undo its answer"
            grouped += 1
    assert grouped, "no notebook declares exercises replayed together any more: remove this test or the machinery"


def test_the_replay_runs_before_a_tagged_cell_only_after_every_check():
    """A notebook may move its replay before one tagged cell (conftest.REPLAY_TAG), never before an exercise's check."""
    import nbformat

    from conftest import replay_position

    moved = []
    for path in sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        if replay_position(nb, path.stem) < len(nb.cells):      # refuses a second tag, or one before a check
            moved.append(path.stem)
    assert moved == ["14_your_cluster", "18_cluster_day"]
    early = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["tests-replay-here"]}),
        nbformat.v4.new_code_cell("def guess(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"),
        nbformat.v4.new_code_cell("checks.check_function(guess, [((1,), 1)], hint='h')")])
    with pytest.raises(AssertionError, match="comes before an exercise's check"):
        replay_position(early, "99_new")


def test_the_paths_through_the_course_name_real_notebooks_and_sections_and_add_up():
    """Each route of the README and INSTRUCTORS.md names notebooks and sections that exist; its hours are the sum of
    its steps (a whole notebook: its opening box's time; some sections: less than the whole)."""
    from course_utils.tooling import routes

    assert routes.problems() == []
    found = routes.load()
    assert {"one_gpu", "cluster", "workshop"} <= set(found)
    for name, route in found.items():
        steps = [routes.Step.parse(s) for s in route["steps"]]
        for step in steps:
            whole = routes.step_minutes(routes.Step(step.prefix), bool(route.get("led")))
            part = routes.step_minutes(step, bool(route.get("led")))
            assert 0 < part <= whole if step.sections else part == whole, (name, str(step))
    first = routes.Step("00")
    box = study_time.box_line(first.notebook())
    assert f"about {routes.step_minutes(first)} min on your own" in box


def test_a_path_that_names_a_missing_notebook_or_section_is_named(tmp_path):
    from course_utils.tooling import routes

    toml = tmp_path / "manifest.toml"
    toml.write_text('[path.x]\ntitle = "X"\nfor_whom = "y"\nsteps = ["03 §99", "42", "3x"]\n[path.z]\ntitle = "Z"\n')
    wrong = routes.problems(toml)
    assert any("03_zero_stages has no section 99" in w for w in wrong)
    assert any("no notebook 42_" in w for w in wrong)
    assert any("not '3x'" in w for w in wrong)
    assert "path z: for_whom missing" in wrong and "path z: steps missing" in wrong
