"""`make hub`: the workshop on one shared server, headless (course_utils.tooling.workshop.hub).

One test runs the whole day through JupyterHub and nbgrader's real exchange, with two participants and the
instructor as Unix users of their own (created for the test, removed after it): the instructor releases the drill
of tests/test_workshop.py while both participants' servers start through the hub's REST API (each on its own
cores); both fetch, solve (one both exercises, one a single exercise) and submit with ``nbgrader`` run as
themselves; the instructor collects, grades with the course's grading and releases the feedback, and each
participant fetches theirs. Then what each may not do: read another's home, the exchange's submissions or
feedback, the instructor's course folder, log in with a wrong password or as the instructor; and the hub, its proxy
and the servers listen on loopback only. After the hub stops, nothing of it runs. An extended test has both
participants launch two ranks at once, each on their own cores (fair sharing, measured).

It needs root (it creates users); elsewhere it is skipped.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import nbformat
import psutil
import pytest
import requests

from course_utils.common import paths
from course_utils.kernel.launch.commands import free_port
from course_utils.tooling.workshop import hub, hub_setup
from test_workshop import DRILL, drill, read, solved

ANN, BEN, TEACHER = "dsc-ann", "dsc-ben", "dsc-teacher"
PASSWORD = "not-the-default-" + uuid.uuid4().hex[:8]
LAUNCH = ("from course_utils import launch\n"
          "r = launch.deepspeed('00_hello.py', procs=2, timeout=240, quiet=True)\n"
          "print('RANKS', sorted(r.per_rank('rank_info')), round(r.seconds, 1))\n")

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not all(map(shutil.which, ("useradd", "runuser", "taskset"))),
                                reason="the hub creates Unix users: root with useradd, runuser and taskset")


@contextmanager
def hub_of_its_own(monkeypatch: pytest.MonkeyPatch, participants: list[str], instructor: str,
                   password: str) -> Iterator[hub.Hub]:
    """A hub of the test's own in a build folder the users can reach (the session's tmp folder is root's only);
    stopped, its users removed and the folder deleted after the test, whatever happens; nothing of it may be left."""
    build = paths.ROOT / "build" / f"test-hub-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("COURSE_BUILD_DIR", str(build))
    users = [*participants, instructor]
    hub_setup.remove_users(users)                                       # what a killed earlier run left
    build.mkdir(parents=True)
    (build / "roster.txt").write_text("# the test's participants\n" + "\n".join(participants) + "\n")
    secret = build / "password"
    secret.write_text(password)
    secret.chmod(0o600)
    try:
        yield hub.start(build / "roster.txt", instructor, port=free_port(), password_file=str(secret), tied=True,
                        open_closed=True, force=True)
    finally:
        hub.stop(remove=True)
        left = hub.leftovers(users)
        shutil.rmtree(build, ignore_errors=True)
        assert not left, f"processes outlived the hub: {[p.info for p in left]}"


@pytest.fixture
def workshop(monkeypatch: pytest.MonkeyPatch) -> Iterator[hub.Hub]:
    with hub_of_its_own(monkeypatch, [ANN, BEN], TEACHER, PASSWORD) as running:
        yield running


def home(name: str) -> Path:
    return hub_setup.folder() / "homes" / name


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args[-6:]} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def refused(name: str, argv: list[str]) -> bool:
    result = hub.as_user(name, argv)
    return result.returncode != 0 and "ermission denied" in result.stderr


def wait_ready(workshop: hub.Hub, name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not workshop.api("GET", f"/users/{name}")["servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"{name}'s server did not start within {timeout} s"
        time.sleep(0.3)


def instructor(step: str, *nbgrader_steps: str) -> str:
    """As the instructor, in their course folder: nbgrader's ``nbgrader_steps`` on the drill (its Python API, with
    the course's configuration), ``step`` (course_utils code) in between: what it printed and logged."""
    before = [s for s in nbgrader_steps if s == "collect"]
    after = [s for s in nbgrader_steps if s != "collect"]
    code = "\n".join(["from pathlib import Path", "from course_utils import workshop", "api = workshop.nbgrader_api()",
                      *(f"r = api.{s}({DRILL!r}); print(r.get('log', '')); assert r['success'], r" for s in before),
                      step, *(f"r = api.{s}({DRILL!r}); print(r.get('log', '')); assert r['success'], r" for s in after)])
    course = hub_setup.folder() / "homes" / TEACHER / "build" / "nbgrader"
    course.mkdir(parents=True, exist_ok=True)
    shutil.chown(course, TEACHER, TEACHER)
    return ok(hub.as_user(TEACHER, [str(Path(os.sys.prefix) / "bin" / "python"), "-c", code], cwd=course))


def at_once(names: list[str], argv: list[str]) -> None:
    """``argv`` run by each of ``names`` at the same time (as participants do); each must succeed."""
    runs = {n: subprocess.Popen(hub.user_argv(n, argv), cwd=home(n), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for n in names}
    for name, run in runs.items():
        out = run.communicate(timeout=300)[0]
        assert run.returncode == 0, f"{name}: {argv[-2:]} failed:\n{out}"


def launch_at_once(names: list[str]) -> dict[str, tuple[str, set[int], float]]:
    """Both participants launch two ranks at the same moment: what each printed, the cores its ranks ran on, and the
    most memory (GiB, resident) all its processes held at once."""
    python = str(Path(os.sys.prefix) / "bin" / "python")
    runs = {n: subprocess.Popen(hub.user_argv(n, [python, "-c", LAUNCH]), cwd=home(n), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for n in names}
    uids = {hub_setup.pwd.getpwnam(n).pw_uid: n for n in names}
    seen: dict[str, set[int]] = {n: set() for n in names}
    peak = dict.fromkeys(names, 0.0)
    while any(r.poll() is None for r in runs.values()):
        held = dict.fromkeys(names, 0.0)
        for p in psutil.process_iter(["uids", "cmdline", "memory_info"]):
            try:
                owner = uids.get(p.info["uids"].real)
                if owner:
                    held[owner] += p.info["memory_info"].rss / 2**30
                if owner and any("00_hello.py" in a for a in p.info["cmdline"] or []):
                    seen[owner].update(p.cpu_affinity())
            except (psutil.Error, TypeError, AttributeError):
                pass
        peak = {n: max(peak[n], held[n]) for n in names}
        time.sleep(0.1)
    return {n: (r.communicate(timeout=60)[0], seen[n], peak[n]) for n, r in runs.items()}


def login(workshop: hub.Hub, name: str, password: str) -> int:
    """The status of a login through the hub's form (302: in; 403: refused)."""
    with requests.Session() as s:
        page = s.get(f"{workshop.url}/hub/login", timeout=30)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
        return s.post(f"{workshop.url}/hub/login", data={"username": name, "password": password, "_xsrf": xsrf},
                      allow_redirects=False, timeout=30).status_code


class Clock:
    """Seconds per step of the day, printed at the end (pytest -s shows them)."""
    def __init__(self) -> None:
        self.last, self.steps = time.monotonic(), []

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append(f"{step} {now - self.last:.1f} s")
        self.last = now


def grades(path: Path) -> dict[str, str]:
    with path.open() as f:
        return {row["participant"]: row["points"] for row in csv.DictReader(f)}


@needs_root
def test_a_workshop_day_through_the_hub_and_the_exchange(workshop, tmp_path):
    nbgrader = str(Path(os.sys.prefix) / "bin" / "nbgrader")
    clock = Clock()
    course = Path(workshop.settings["instructor_course"])
    source = drill(hub_setup.folder() / "drill")                   # the instructor's notebook, readable by all
    for name in (ANN, BEN):                                        # their servers start while the instructor works
        workshop.api("POST", f"/users/{name}/server", {})
    # nbgrader's Python API in one interpreter for the instructor's steps (the same as `nbgrader release_assignment`,
    # `collect`, `release_feedback`; INSTRUCTORS.md gives the commands): each command would start Python again
    instructor(f"workshop.release(['99'], folder=Path({str(source.parent)!r}))", "release_assignment")
    clock("release")
    for name in (ANN, BEN):
        wait_ready(workshop, name)
    servers = {n: next(p for p in psutil.process_iter(["username", "cmdline"]) if p.info["username"] == n
                       and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or [])) for n in (ANN, BEN)}
    cores = {n: set(p.cpu_affinity()) for n, p in servers.items()}
    assert cores == {n: set(map(int, workshop.settings["shares"][n]["cpus"].split(","))) for n in (ANN, BEN)}
    assert not cores[ANN] & cores[BEN] or len(os.sched_getaffinity(0)) < 2, f"participants share cores: {cores}"
    clock("two servers")

    course_nb, released = read(source), read(course / "release" / DRILL / f"{DRILL}.ipynb")
    answers = {ANN: course_nb, BEN: solved(course_nb, released, {"double"})}
    at_once([ANN, BEN], [nbgrader, "fetch_assignment", DRILL])
    for name, nb in answers.items():
        fetched = home(name) / DRILL / f"{DRILL}.ipynb"
        assert [c.source for c in read(fetched).cells] == [c.source for c in released.cells]
        nbformat.write(nb, str(fetched))                           # the participant's work
    at_once([ANN, BEN], [nbgrader, "submit", DRILL])
    clock("fetch, submit")
    collected = instructor("workshop.grade(workshop.root() / 'submitted', timeout=60)", "collect", "release_feedback")
    assert f"Collecting submission: {BEN} {DRILL}" in collected and "NOT GRADED" not in collected, collected
    assert grades(course / "grades.csv") == {ANN: "2", BEN: "1"}
    clock("collect, grade, release feedback")
    at_once([ANN, BEN], [nbgrader, "fetch_feedback", DRILL])
    for name in (ANN, BEN):
        feedback = list((home(name) / DRILL / "feedback").rglob("*.html"))
        assert len(feedback) == 1, f"{name}'s feedback: {feedback}"
        score = re.search(r"Score: ([0-9.]+) / ([0-9.]+)", feedback[0].read_text())
        assert score and float(score[1]) == {ANN: 2, BEN: 1}[name] and float(score[2]) == 2, f"{name}: {score}"

    clock("fetch feedback")
    # what a participant may not do
    exchange = Path(workshop.settings["exchange"]) / "deepspeed-course"
    assert refused(ANN, ["ls", str(home(BEN))]) and refused(ANN, ["cat", str(home(BEN) / DRILL / f"{DRILL}.ipynb")])
    assert refused(ANN, ["ls", str(exchange / "inbound")]), "a participant lists the others' submissions"
    assert refused(ANN, ["ls", str(exchange / "feedback")]), "a participant lists the others' feedback"
    assert refused(ANN, ["ls", str(course)]) and refused(BEN, ["cat", str(course / "grades.csv")])
    assert login(workshop, ANN, PASSWORD + "x") == 403 and login(workshop, "dsc-nobody", PASSWORD) == 403
    assert login(workshop, TEACHER, PASSWORD) == 403, "the participants' password opens the instructor's account"
    assert login(workshop, ANN, PASSWORD) == 302
    proxy_and_hub = [psutil.Process(workshop.pid), *psutil.Process(workshop.pid).children(recursive=True)]
    listening = {c.laddr.ip for p in proxy_and_hub for c in p.net_connections("inet") if c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}, f"the hub, its proxy or a server listens beyond loopback: {listening}"
    clock("security")
    print("\n" + "; ".join(clock.steps))


@needs_root
@pytest.mark.extended      # two real launches at once on a shared server: a minute or two on 2 busy cores
def test_two_participants_launch_at_once_each_on_their_cores(workshop):
    """Fair sharing: both participants launch two ranks at the same moment; both finish, each on its own cores."""
    cores = {n: set(map(int, workshop.settings["shares"][n]["cpus"].split(","))) for n in (ANN, BEN)}
    assert not cores[ANN] & cores[BEN] or len(os.sched_getaffinity(0)) < 2, f"participants share cores: {cores}"
    started = time.monotonic()
    launched = launch_at_once([ANN, BEN])
    for name, (printed, ran_on, _) in launched.items():
        assert "RANKS [0, 1]" in printed, f"{name}'s launch:\n{printed}"
        assert ran_on and ran_on <= cores[name], f"{name}'s ranks ran on {ran_on}, their share is {cores[name]}"
    print(f"\ntwo launches at once: {time.monotonic() - started:.1f} s for both; "
          + ", ".join(f"{n}: {p.split()[-1]} s, at most {gib:.2f} GiB" for n, (p, _, gib) in launched.items()))


def test_no_password_no_hub(tmp_path, monkeypatch):
    monkeypatch.delenv("HUB_PASSWORD", raising=False)
    monkeypatch.delenv("HUB_PASSWORD_FILE", raising=False)
    with pytest.raises(SystemExit, match="No workshop password"):
        hub_setup.read_password()
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(SystemExit, match="8 characters"):
        hub_setup.read_password(str(tmp_path / "short"))
    (tmp_path / "roster").write_text("ann\nBen Smith\n")
    with pytest.raises(SystemExit, match="Ben Smith"):
        hub_setup.read_roster(tmp_path / "roster")


def test_preflight_counts_the_roster_against_the_server():
    cores = len(os.sched_getaffinity(0))
    assert not [p for p in hub_setup.preflight(1) if p.startswith(("cores", "RAM"))] or cores < 1
    too_many = hub_setup.preflight(cores // hub_setup.CORES_PER_PARTICIPANT + 1)
    assert any(p.startswith(f"cores: {cores} here") for p in too_many), too_many
