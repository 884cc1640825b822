"""`make hub` in a real browser: Debian's chromium driven by Playwright (its Python package, the system browser).

Two participants log in through the hub's form, fetch notebook 00 in the Assignments tab, run it down to its launch
cell (two ranks start and finish) and submit it there. The instructor collects and grades with the course's grading
(smoke parameters), then the formgrader's student list shows both. Screenshots go to ``build/hub-screenshots/``.

A few minutes on 2 cores (two logins, two runs of 00's first cells, two gradings of 00): ``make test`` leaves it out;
run it with ``bash .ci/install-hub && .venv/bin/python -m pytest -m browser tests/test_hub_browser.py -p no:xdist``.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import nbformat
import pytest

from course_utils.common import paths
from course_utils.tooling.workshop import hub, hub_setup
from test_hub import hub_of_its_own

CHROMIUM = "/usr/bin/chromium"
CAT, DAN, TUTOR = "dsc-cat", "dsc-dan", "dsc-tutor"     # not the headless test's users: both may run at once
NB = "00_setup_and_first_launch"
PASSWORD = "browser-" + uuid.uuid4().hex[:8]
LAUNCH_CELL = next(i for i, c in enumerate(nbformat.read(str(paths.NOTEBOOKS / f"{NB}.ipynb"), as_version=4).cells)
                   if 'launch.deepspeed("00_hello.py"' in c.source)
SHOTS = paths.ROOT / "build" / "hub-screenshots"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CHROMIUM, os.X_OK) or not shutil.which("runuser"),
    reason="needs root (the hub creates users) and Debian's chromium (bash .ci/install-hub)")]


@pytest.fixture(autouse=True)
def only_when_asked(request: pytest.FixtureRequest) -> None:
    if "browser" not in (request.config.option.markexpr or "") or "not browser" in request.config.option.markexpr:
        pytest.skip("a few minutes in chromium: run it with pytest -m browser")


@pytest.fixture
def workshop(monkeypatch: pytest.MonkeyPatch) -> Iterator[hub.Hub]:
    with hub_of_its_own(monkeypatch, [CAT, DAN], TUTOR, PASSWORD) as running:
        yield running


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)   # a fresh profile of Playwright's own
        try:
            yield chromium
        finally:
            chromium.close()


def log_in(browser, workshop: hub.Hub, name: str, password: str):
    """A page of ``name``'s own browser context, logged in through the hub's form; it lands in JupyterLab."""
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(120_000)
    page.goto(f"{workshop.url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.click("input[type=submit], button[type=submit]")
    return page


def open_assignments(page) -> None:
    page.get_by_role("menuitem", name="Nbgrader").click()
    page.get_by_role("menuitem", name="Assignment List").click()
    page.wait_for_selector("#nbgrader-assignment-list, .nbgrader-mainarea-widget")


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def participant_day(browser, workshop: hub.Hub, name: str) -> str:
    """Log in, fetch 00 in the Assignments tab, run it down to the launch cell, save, submit: the launch's output."""
    page = log_in(browser, workshop, name, PASSWORD)
    page.wait_for_url(re.compile(rf"/user/{name}/lab"), timeout=180_000)
    page.wait_for_selector(".jp-LabShell, #jp-main-dock-panel")
    open_assignments(page)
    released = page.locator("#released_assignments_list .list_item", has_text=NB)
    released.get_by_role("button", name="Fetch").click()
    downloaded = page.locator("#fetched_assignments_list .list_item", has_text=NB)
    downloaded.first.wait_for()
    shot(page, f"{name}-1-fetched")
    downloaded.first.locator("a.assignment-notebooks-link").click()  # the assignment: its notebooks
    downloaded.first.locator(".assignment-notebooks a", has_text=NB).first.evaluate("a => a.click()")  # open it
    cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell")
    # the kernel first (a run asked for before it is connected is dropped), then the title: selected, command mode
    page.wait_for_selector('.jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator[data-status="idle"]',
                           timeout=300_000)
    cells.first.click()
    page.keyboard.press("Escape")
    for _ in range(LAUNCH_CELL + 1):                # down to the cell after the launch
        page.keyboard.press("ArrowDown")
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Above Selected Cell").click()
    launch = page.locator(".jp-NotebookPanel:visible .jp-Cell.jp-mod-selected").locator(
        "xpath=preceding-sibling::div[contains(@class, 'jp-Cell')][1]")
    assert 'launch.deepspeed("00_hello.py"' in launch.locator(".jp-InputArea").inner_text()
    prompt = launch.locator(".jp-InputArea-prompt")
    page.wait_for_function("(p) => /\\[\\d+\\]/.test(p.innerText)", arg=prompt.element_handle(), timeout=480_000)
    output = launch.locator(".jp-OutputArea").inner_text()
    launch.scroll_into_view_if_needed()
    shot(page, f"{name}-2-launched")
    page.keyboard.press("Control+s")
    page.wait_for_selector(".jp-NotebookPanel:visible ~ * .jp-mod-dirty, .lm-TabBar-tab.jp-mod-current.jp-mod-dirty",
                           state="detached")                      # saved
    open_assignments(page)
    page.locator("#fetched_assignments_list .list_item", has_text=NB).get_by_role("button", name="Submit").first.click()
    page.locator("#submitted_assignments_list .list_item", has_text=NB).first.wait_for()
    shot(page, f"{name}-3-submitted")
    page.context.close()
    return output


def test_two_participants_and_the_instructor_in_chromium(workshop, browser):
    python, nbgrader = str(Path(os.sys.prefix) / "bin" / "python"), str(Path(os.sys.prefix) / "bin" / "nbgrader")
    course = Path(workshop.settings["instructor_course"])
    for argv, cwd in (([python, "-m", "course_utils.tooling.workshop", "release", "--only", "00"], paths.ROOT),
                      ([nbgrader, "release_assignment", NB], course)):
        done = hub.as_user(TUTOR, argv, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr

    for name in (CAT, DAN):
        try:
            output = participant_day(browser, workshop, name)
        except Exception:
            for i, page in enumerate(p for c in browser.contexts for p in c.pages):
                shot(page, f"{name}-failed-{i}")
            raise
        assert "[rank 0]" in output and "[rank 1]" in output, f"{name}'s launch cell showed:\n{output}"

    collected = Path(workshop.settings["homes"]) / TUTOR / "collected"
    for argv, cwd in (([nbgrader, "collect", NB], course), (["cp", "-r", str(course / "submitted"), str(collected)], None),
                      ([python, "-m", "course_utils.tooling.workshop", "grade", str(collected), "--smoke"], paths.ROOT)):
        done = hub.as_user(TUTOR, argv, cwd=cwd, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
    admin = (hub_setup.folder() / "state" / "admin_password").read_text()
    page = log_in(browser, workshop, TUTOR, admin)
    page.wait_for_url(re.compile(rf"/user/{TUTOR}/lab"), timeout=180_000)
    page.goto(f"{workshop.url}/user/{TUTOR}/formgrader/manage_students")
    table = page.locator("table")
    rows = {name: table.locator("tr", has_text=name).first for name in (CAT, DAN)}
    for row in rows.values():
        row.wait_for()
    shot(page, "instructor-students")
    for name, row in rows.items():           # the launch cell alone solves no exercise: a score out of 2 each
        assert re.search(r"\b0(\.0)? / 2\b", row.inner_text()), f"{name}: {row.inner_text()}"
