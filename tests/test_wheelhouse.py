"""The offline install: ``make wheelhouse`` and ``make setup WHEELHOUSE=<folder>``.

The fast tests need no network: pip resolves and downloads small wheels written here, served by an HTTP server on
loopback with pip's configuration and the machine's indexes switched off; the target is the next Python version,
so the markers pip evaluates for this one differ from the target's. The extended test makes the real wheelhouse for
this machine (about 1 GB from the package index) and installs the course from it with the Makefile's own commands,
pip's configuration off and any network use failing, into a fresh virtual environment.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest

from course_utils.common import paths, reaper
from course_utils.tooling import wheelhouse as wh

HERE = wh.this_python()
NEXT = f"3.{sys.version_info[1] + 1}"       # the target: markers for it differ from this Python's
OFFLINE = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "no_proxy": "127.0.0.1"}      # port 9 (discard): any download fails
PIP_SETTINGS = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT")


def write_wheel(folder: Path, name: str, version: str = "1.0", requires: tuple[str, ...] = (),
                tag: str = "py3-none-any") -> Path:
    """A wheel holding only its metadata: enough for pip to resolve, download and install it."""
    info = f"{name}-{version}.dist-info"
    wheel = folder / f"{name}-{version}-{tag}.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{info}/METADATA", metadata)
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A folder of wheels served over HTTP on loopback, pip's only source (its configuration files and the
    machine's PIP_* settings off). Yields the folder: the tests write their wheels there."""
    folder = tmp_path / "index"
    folder.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=folder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in PIP_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**OFFLINE, "PIP_FIND_LINKS": f"http://127.0.0.1:{server.server_address[1]}/"}.items():
        monkeypatch.setenv(name, value)
    try:
        yield folder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def requirements(tmp_path: Path, *lines: str) -> Path:
    file = tmp_path / "requirements.txt"
    file.write_text("# pins\n" + "".join(f"{line}\n" for line in lines))
    return file


def build(tmp_path: Path, pins: Path, exclude: tuple[str, ...] = (), python: str = NEXT,
          platform: str = "manylinux_2_28_x86_64") -> dict:
    return wh.build(tmp_path / "wheelhouse", wh.Target(python, (platform,)), exclude, pins, tools=[])


def test_a_manylinux_tag_brings_every_older_one():
    tags = wh.compatible_tags("manylinux_2_28_x86_64")
    assert (tags[0], tags[11], tags[23]) == ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux_2_5_x86_64")
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags and len(tags) == 24 + 3
    arm = wh.compatible_tags("manylinux2014_aarch64")      # the older names: manylinux1 and 2010 were x86 only
    assert arm[0] == "manylinux_2_17_aarch64" and arm[-1] == "manylinux2014_aarch64" and len(arm) == 13 + 1
    assert wh.compatible_tags("linux_x86_64") == ["linux_x86_64"]
    target = wh.Target("3.12", ("manylinux_2_17_x86_64", "manylinux_2_28_x86_64"))
    assert target.tags().count("manylinux_2_17_x86_64") == 1 and "manylinux_2_28_x86_64" in target.tags()
    assert target.pip_args()[:3] == ["--only-binary=:all:", "--python-version", "3.12"]


def test_the_machine_tag_comes_from_glibc_and_elsewhere_the_platform_must_be_named(monkeypatch, capsys):
    assert wh.machine_tag(("glibc", "2.36"), "Linux", "x86_64") == "manylinux_2_36_x86_64"
    assert wh.machine_tag(("", ""), "Linux", "x86_64") is None            # musl (Alpine)
    assert wh.machine_tag(("", ""), "Darwin", "arm64") is None
    monkeypatch.setattr(wh, "machine_tag", lambda: None)
    assert wh.main(["build", "/nonexistent/wheelhouse"]) == 1
    assert "WHEEL_PLATFORM=manylinux_2_28_x86_64" in capsys.readouterr().err
    assert not Path("/nonexistent/wheelhouse").exists()


def test_arguments_and_requirements_are_checked_before_anything_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        wh.main(["build", str(tmp_path / "w"), "--python", "311"])
    assert e.value.code == 2 and "'311' is not a Python version like 3.12" in capsys.readouterr().err
    bad = requirements(tmp_path, "alpha==1.0", "--extra-index-url https://example.org")
    assert wh.main(["build", str(tmp_path / "w"), "--platform", "manylinux_2_28_x86_64",
                    "--requirements", str(bad)]) == 1
    assert "requirements.txt line 3: '--extra-index-url https://example.org' is a pip option" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    assert wh.read_requirements(requirements(tmp_path, "alpha==1.0  # why", "beta>=2")) == ["alpha==1.0", "beta>=2"]


def test_the_closure_follows_the_targets_markers_and_extras():
    entries = {n: {"metadata": {"name": n, "version": v, "requires_dist": r}} for n, v, r in [
        ("a", "1.0", ["b>=1", f"c; python_version >= '{NEXT}'", f"d; python_version < '{NEXT}'", "e[fast]"]),
        ("b", "1.0", []), ("d", "1.0", []), ("e", "1.0", ["f; extra == 'fast'", "g; extra == 'docs'"]),
        ("f", "1.0", ["b>=2"]), ("g", "1.0", [])]}
    needed, unmet = wh.closure(entries, ["a==1.0"], {"python_version": NEXT, "python_full_version": f"{NEXT}.0"})
    assert needed == {"a", "b", "e", "f"} and sorted(map(str, unmet)) == ['b>=2', f'c; python_version >= "{NEXT}"']
    assert wh.closure(entries, ["a==1.0"], {"python_version": HERE}, frozenset({"e"}))[0] == {"a", "b", "d"}
    assert {wh.unmarked(r) for r in unmet} == {"b>=2", "c"}


def test_a_wheelhouse_for_another_python_with_a_package_left_out(tmp_path, index, capsys):
    write_wheel(index, "alpha", requires=("beta", "gamma>=1", f"epsilon; python_version >= '{NEXT}'",
                                          f"eta; python_version < '{NEXT}'"))
    for name, requires in [("beta", ()), ("gamma", ("zeta",)), ("zeta", ()), ("epsilon", ()), ("eta", ())]:
        write_wheel(index, name, requires=requires)
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    (folder / "old-0.1-py3-none-any.whl").write_text("from an earlier make wheelhouse")
    (folder / wh.MANIFEST).write_text("python: 3.11\n")
    fields = build(tmp_path, requirements(tmp_path, "alpha==1.0"), exclude=("Gamma",))
    assert "also needs epsilon" in capsys.readouterr().out       # pip, run by this Python, left it out
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [wh.MANIFEST] + [f"{n}-1.0-py3-none-any.whl" for n in ("alpha", "beta", "epsilon")])
    assert fields["python"] == [NEXT] and fields["pin"] == ["alpha==1.0"] and fields["excluded"] == ["gamma"]
    assert fields["left out with them"] == ["zeta"] and "manylinux1_x86_64" in fields["platforms"][0].split()
    problems = wh.check(folder, tmp_path / "requirements.txt")
    assert len(problems) == 2 and f"made for Python {NEXT}; this is Python {HERE}" in problems[0]
    assert f"WHEEL_PYTHON={HERE}" in problems[0] and "gamma was left out" in problems[1]


def test_a_pin_without_a_wheel_for_the_target_is_named_with_the_target(tmp_path, index):
    write_wheel(index, "delta", tag=f"cp3{sys.version_info[1]}-cp3{sys.version_info[1]}-manylinux_2_17_x86_64")
    with pytest.raises(wh.WheelhouseError) as e:
        build(tmp_path, requirements(tmp_path, "delta==1.0"))
    assert str(e.value).startswith(f"no wheel of delta==1.0 for Python {NEXT} on manylinux_2_28_x86_64.")
    assert "WHEEL_EXCLUDE=delta" in str(e.value)


# pip 26.3's words where a constraint (pip.conf's, here torch<=2.14.1) names the package with no wheel
CONFLICT = """ERROR: Cannot install torch==2.13.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.13.0
    The user requested (constraint) torch<=2.14.1

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
"""


def test_no_wheel_said_as_a_conflict_is_named_too():
    said = wh.no_wheel(CONFLICT, wh.Target("3.9", ("manylinux_2_28_x86_64",)), ["numpy==2.4.6", "torch==2.13.0"])
    assert said.startswith("no wheel of torch==2.13.0 for Python 3.9 on manylinux_2_28_x86_64. ")
    assert wh.no_wheel("ERROR: ResolutionImpossible", wh.Target("3.9", ("linux_x86_64",)), []) is None


def test_an_exclusion_the_course_does_not_need_and_a_folder_of_other_files_are_refused(tmp_path, index):
    write_wheel(index, "alpha")
    with pytest.raises(wh.WheelhouseError, match="WHEEL_EXCLUDE names tourch, which the course does not need"):
        build(tmp_path, requirements(tmp_path, "alpha==1.0"), exclude=("tourch",))
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_text("")
    with pytest.raises(wh.WheelhouseError, match="holds files and no MANIFEST.txt"):
        wh.build(other, wh.Target(NEXT, ("manylinux_2_28_x86_64",)), (), tmp_path / "requirements.txt", tools=[])
    assert [p.name for p in other.iterdir()] == ["cat.jpg"]


def test_check_says_what_to_change(tmp_path, index):
    write_wheel(index, "pytest", version="1.0")     # a name this Python has installed, in another version
    pins = requirements(tmp_path, "pytest==1.0")
    folder = tmp_path / "wheelhouse"
    build(tmp_path, pins, python=HERE, platform=wh.this_platform())
    assert wh.check(folder, pins) == []
    pins.write_text("pytest==2.0\n")
    assert wh.check(folder, pins)[0].startswith("requirements.txt has changed since the wheelhouse was made "
                                                "(pytest==1.0, pytest==2.0): make it again")
    assert wh.excluded_problems("pytest", ["pytest>=1"]) == []
    assert "this Python" in wh.excluded_problems("no-such-package-here", [])[0]
    mismatch = wh.excluded_problems("pytest", ["pytest==1.0"])
    assert len(mismatch) == 1 and "requirements.txt pins pytest==1.0, which the wheelhouse left out" in mismatch[0]
    (folder / wh.MANIFEST).write_text(wh.INCOMPLETE + "\n")
    with pytest.raises(wh.WheelhouseError, match="never finished: run make wheelhouse again"):
        wh.check(folder, pins)


def test_the_machine_must_run_every_wheel():
    wheels = ["a-1.0-py3-none-any.whl", "b-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
              "c-1.0-cp312-abi3-manylinux_2_28_x86_64.whl", "d-1.0-cp312-cp312-manylinux1_x86_64.whl"]
    assert wh.platform_problems(wheels, "manylinux_2_36_x86_64") == []
    assert wh.platform_problems(wheels, "manylinux_2_17_x86_64") == [
        "wheels of the wheelhouse that do not run on this machine (manylinux_2_17_x86_64): "
        "c-1.0-cp312-abi3-manylinux_2_28_x86_64.whl; make it again with WHEEL_PLATFORM=manylinux_2_17_x86_64"]
    assert wheels[1] in wh.platform_problems(wheels, "manylinux_2_36_aarch64")[0]
    assert "no glibc Linux" in wh.platform_problems(wheels, None)[0]
    assert wh.platform_problems(wheels[:1], None) == []


def test_only_a_pure_python_wheel_passes():
    assert wh.is_pure("deepspeed-0.19.8-py3-none-any.whl") and wh.is_pure("six-1.17.0-py2.py3-none-any.whl")
    assert not wh.is_pure("deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl")
    assert not wh.is_pure("ninja-1.13.2-py3-none-manylinux2014_x86_64.whl")


def test_a_command_past_its_timeout_is_stopped_with_everything_it_started():
    with pytest.raises(wh.CommandFailed) as e:
        wh.run(["sh", "-c", "sleep 60 & echo $!; wait"], timeout=1)
    assert str(e.value).startswith("`sh -c sleep 60 & echo $!; wait` ran past 1 s and was stopped")
    assert not reaper.alive(int(e.value.output.split()[0]))
    with pytest.raises(wh.CommandFailed, match="exited with 3; the end of its output:\nwhy"):
        wh.run(["sh", "-c", "echo why; exit 3"], timeout=10)


def make_dry(*args: str) -> str:
    """What ``make`` would run (``-n``), every target remade (``-B``)."""
    return wh.run(["make", "-n", "-B", *args], timeout=60, cwd=paths.ROOT)


def packages_step(make_output: str) -> str:
    """The ``packages`` step of set-up in ``make -n`` output, its continued lines joined."""
    lines = make_output.splitlines()
    start = next(i for i, line in enumerate(lines) if " step packages " in line and " -- " in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    return "\n".join(lines[start:end + 1])


def test_setup_installs_from_the_wheelhouse_without_an_index_only_when_told(tmp_path):
    offline = packages_step(make_dry("setup", f"WHEELHOUSE={tmp_path}"))
    assert offline.count(f'--no-index --find-links "{tmp_path}"') == 3          # pip, requirements.txt, course_utils
    assert f'-m course_utils.tooling.wheelhouse check "{tmp_path}" && ' in offline
    online = packages_step(make_dry("setup"))
    assert "--no-index" not in online and "wheelhouse" not in online and online.count("pip install -q") == 3
    relative = packages_step(make_dry("setup", "WHEELHOUSE=build/wheels"))
    assert f'--find-links "{paths.ROOT / "build/wheels"}"' in relative


def test_make_wheelhouse_passes_its_settings():
    default = make_dry("wheelhouse")
    assert 'wheelhouse build "build/wheelhouse"' in default and "--python" not in default
    given = make_dry("wheelhouse", "WHEELHOUSE=/x", "WHEEL_PYTHON=3.12", "WHEEL_EXCLUDE=torch",
                     "WHEEL_PLATFORM=manylinux_2_17_x86_64 manylinux_2_28_x86_64")
    given = " ".join(word for word in given.split() if word != "\\")       # the recipe's continued lines
    assert ('wheelhouse build "/x" --python 3.12 --platform manylinux_2_17_x86_64 manylinux_2_28_x86_64 '
            '--exclude torch') in given


@pytest.mark.extended       # about 1 GB from the package index and an install of the whole stack: minutes
def test_a_real_wheelhouse_installs_the_course_without_network(monkeypatch):
    scratch = Path(tempfile.mkdtemp(prefix="wheelhouse-test-"))
    try:
        folder, venv = scratch / "wheelhouse", scratch / "venv"
        fields = wh.build(folder, wh.Target(HERE, (wh.this_platform(),)))
        assert any(f.startswith("deepspeed-") and wh.is_pure(f) for f in fields["wheel"])
        wh.run([sys.executable, "-m", "venv", str(venv)], timeout=300)
        for name in PIP_SETTINGS:
            monkeypatch.delenv(name, raising=False)
        for name, value in {**OFFLINE, "COURSE_BUILD_DIR": str(scratch / "build")}.items():
            monkeypatch.setenv(name, value)
        step = packages_step(make_dry("setup", f"WHEELHOUSE={folder}", f"PY={venv / 'bin' / 'python'}"))
        wh.run(["bash", "-c", step], timeout=1800, cwd=paths.ROOT)      # the Makefile's own commands
        pinned = next(p for p in wh.read_requirements(wh.REQUIREMENTS) if p.startswith("deepspeed=="))
        imported = wh.run([str(venv / "bin" / "python"), "-c", "import deepspeed, transformers, datasets, papermill, "
                           "nbgrader, course_utils; print('deepspeed', deepspeed.__version__)"], timeout=600,
                          cwd=scratch)      # not the repository: course_utils as installed
        assert imported.strip().splitlines()[-1] == pinned.replace("==", " ")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
