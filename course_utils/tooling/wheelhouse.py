"""An install of the course without network: ``make wheelhouse`` writes a folder of wheels on a machine that has
network, and ``make setup WHEELHOUSE=<folder>`` installs from it with pip's ``--no-index``.

Why: the compute nodes of many clusters reach no package index, and neither does a GPU machine lent for a few
minutes (an image with Python and a CUDA torch, none of the rest of the stack). The folder is made on a login node,
or any machine with network, for the compute nodes' Python version and platform, then copied over.

What ``build`` does, and why each step is so:

1. DeepSpeed is on PyPI as source only: it is built here into a pure-Python wheel with ``DS_BUILD_OPS=0`` (no op is
   compiled ahead; each is JIT-built where it is first loaded, as on any install of the course). pip builds it in
   an isolated environment that holds setuptools only (the sdist has no ``pyproject.toml``), so its ``setup.py``
   finds no torch and records no torch or CUDA version and no ``nvidia-ml-py`` requirement, whatever torch this
   machine has: it is the wheel ``make setup`` builds online, and it fits a CPU and a CUDA torch alike. It must come
   out ``py3-none-any``.
2. pip resolves every pin of requirements.txt, what the pins need, and what set-up installs besides (pip itself,
   the build backend of ``pyproject.toml``) for the target: ``pip install --dry-run --ignore-installed --report``
   with ``--python-version``, ``--platform`` and ``--only-binary=:all:``. pip matches a platform tag exactly, so
   ``manylinux_2_28_x86_64`` goes to pip with every older manylinux tag (a machine with glibc 2.28 runs them all).
   pip evaluates environment markers (``typing_extensions; python_version < "3.12"``) for the Python that runs
   it, not for ``--python-version`` (pip 26.3); so the packages needed are worked out again here under the
   target's markers, and one that only the target needs goes back to pip as a requirement of its own.
3. ``--exclude`` leaves out packages the target already has (torch on a CUDA image, whose CUDA build must stay),
   and with them what only they need.
4. The resolved files go in, each checked by name and sha256: copied where pip found them on disk (a
   ``--find-links`` folder), fetched by ``pip download --no-deps`` otherwise.
5. ``MANIFEST.txt`` records the pins, the target and what was left out. ``check`` reads it before an offline
   install and says what to change when the folder does not fit this Python, this machine or requirements.txt.

pip's own configuration applies to every step (``pip.conf``, ``PIP_EXTRA_INDEX_URL``): another index, one with
another torch build say, is given to pip that way. Standard library only (and pip's own copy of ``packaging``
where ``packaging`` is not installed): ``make wheelhouse`` runs it with the Python that would make ``.venv``, and
``make setup`` runs ``check`` before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote, urlparse

from course_utils.common import paths, reaper

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
except ImportError:     # a Python with pip only: pip's own copy
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.utils import canonicalize_name

MANIFEST = "MANIFEST.txt"
REQUIREMENTS = paths.ROOT / "requirements.txt"
# PyPI has these as source only: each is built here into a pure-Python wheel with these settings.
FROM_SOURCE = {"deepspeed": {"DS_BUILD_OPS": "0"}}
BUILD_TIMEOUT, RESOLVE_TIMEOUT, DOWNLOAD_TIMEOUT = 900, 900, 3600     # seconds; the downloads are about 1 GB
# The manylinux tags named before PEP 600, and the glibc version each stands for.
LEGACY = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
PASSES = 3      # resolutions at most: the first, then one more for each round of packages only the target needs
INCOMPLETE = "state: being made (a `make wheelhouse` that did not finish leaves this line; run it again)"


class WheelhouseError(Exception):
    """What stops the wheelhouse, and what to change."""


class CommandFailed(WheelhouseError):
    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


def tail(text: str, lines: int = 25) -> str:
    """The end of a command's output, pip's warnings left out where there is more (pip.conf's unreachable
    locations, one line each, would crowd out its error)."""
    kept = [line for line in text.strip().splitlines() if not line.startswith("WARNING:")] or text.splitlines()
    return "\n".join(kept[-lines:]) or "(nothing)"


def run(argv: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None) -> str:
    """Run ``argv`` in a session of its own and return what it printed (:func:`course_utils.common.reaper.call`).
    A non-zero exit raises :class:`CommandFailed`; after ``timeout`` seconds, or on an interrupt, it is ended with
    everything it started first."""
    shown = " ".join(argv[:4]) + (" …" if len(argv) > 4 else "")
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "output"
        code = reaper.call(argv, log, timeout, env, cwd)
        out = log.read_text(errors="replace")
    if code is None:
        raise CommandFailed(f"`{shown}` ran past {timeout:g} s and was stopped; the end of its output:\n{tail(out)}",
                            out)
    if code != 0:
        raise CommandFailed(f"`{shown}` exited with {code}; the end of its output:\n{tail(out)}", out)
    return out


def pip(args: list[str], timeout: float, env: dict | None = None) -> str:
    return run([sys.executable, "-m", "pip", *args], timeout, env)


# --- the target: a Python version and the platform tags of its machines -------------------------------------------

def compatible_tags(tag: str) -> list[str]:
    """``tag`` and every platform tag a machine of that tag also runs, newest first: ``manylinux_2_N_<arch>`` runs
    ``manylinux_2_M`` for every M ≤ N and the older names of those (PEP 600). Other tags stand alone."""
    legacy = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", tag)
    if legacy:
        tag = f"manylinux_2_{LEGACY[legacy[1]]}_{legacy[2]}"
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not m:
        return [tag]
    glibc, arch = int(m[1]), m[2]
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, LEGACY["manylinux1"] - 1, -1)]
    return tags + [f"{name}_{arch}" for name, n in LEGACY.items()      # manylinux1 and 2010 were x86 only
                   if n <= glibc and (name == "manylinux2014" or arch in ("x86_64", "i686"))]


def this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def machine_tag(libc: tuple[str, str] | None = None, system: str | None = None,
                machine: str | None = None) -> str | None:
    """This machine's manylinux tag, from its glibc version and architecture; None off a glibc Linux."""
    lib, version = libc or platform.libc_ver()
    if (system or platform.system()) != "Linux" or lib != "glibc" or not re.match(r"2\.\d+", version):
        return None
    return f"manylinux_2_{version.split('.')[1]}_{machine or platform.machine()}"


def this_platform() -> str:
    """:func:`machine_tag`, or what to say instead off a glibc Linux."""
    tag = machine_tag()
    if tag is None:
        raise WheelhouseError(f"this machine ({platform.system()}) is not a glibc Linux: name the compute nodes' "
                              "platform, e.g. WHEEL_PLATFORM=manylinux_2_28_x86_64 (on a node, `ldd --version` says "
                              "its glibc and `uname -m` its architecture)")
    return tag


def python_version(text: str) -> str:
    """argparse's check of ``--python``: a version like 3.12."""
    if not re.fullmatch(r"3\.\d{1,2}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version like 3.12 (major.minor)")
    return text


@dataclass(frozen=True)
class Target:
    python: str                     # "3.12"
    platforms: tuple[str, ...]      # as given: ("manylinux_2_28_x86_64",)

    def __str__(self) -> str:
        return f"Python {self.python} on {' '.join(self.platforms)}"

    def tags(self) -> list[str]:
        return list(dict.fromkeys(t for p in self.platforms for t in compatible_tags(p)))

    def pip_args(self) -> list[str]:
        return ["--only-binary=:all:", "--python-version", self.python,
                *[arg for tag in self.tags() for arg in ("--platform", tag)]]

    def environment(self, resolving: dict) -> dict:
        """The environment markers are evaluated in: the resolving Python's (pip's report), with the target's
        Python version and architecture (its patch release is not known: ``.0``)."""
        env = {**resolving, "python_version": self.python, "python_full_version": f"{self.python}.0"}
        if env.get("implementation_name") == "cpython":
            env["implementation_version"] = f"{self.python}.0"
        arch = re.search(r"_(x86_64|i686|aarch64|armv7l|ppc64le|ppc64|s390x)$", self.platforms[0])
        return {**env, "platform_machine": arch[1]} if arch else env


# --- what to put in: requirements.txt, the packages they need under the target's markers -------------------------

def read_requirements(file: Path) -> list[str]:
    """The requirements of ``file``, one a line (comments and blank lines left out)."""
    pins = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise WheelhouseError(f"{file.name} line {n}: {line!r} is a pip option; the wheelhouse reads "
                                  "requirements only (name==version), one a line")
        try:
            Requirement(line)
        except InvalidRequirement as e:
            raise WheelhouseError(f"{file.name} line {n}: {e}") from None
        pins.append(line)
    return pins


def setup_tools() -> list[str]:
    """What set-up installs besides requirements.txt: pip (``--upgrade pip``) and the build backend of
    ``pyproject.toml`` (the editable install of course_utils builds with it)."""
    try:
        import tomllib
    except ImportError:     # Python 3.10
        from pip._vendor import tomli as tomllib
    return ["pip", *tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["build-system"]["requires"]]


def closure(entries: dict[str, dict], roots: list[str], env: dict,
            excluded: frozenset[str] = frozenset()) -> tuple[set[str], list[Requirement]]:
    """The packages ``roots`` need under the markers of ``env`` (names of ``entries``: pip's report, name →
    entry), not following ``excluded``; and the requirements met by no entry (absent, or another version)."""
    needed, unmet, seen = set(), [], set()
    todo = [r for r in map(Requirement, roots) if r.marker is None or r.marker.evaluate({**env, "extra": ""})]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in excluded:
            continue
        entry = entries.get(name)
        if entry is None or not req.specifier.contains(entry["metadata"]["version"], prereleases=True):
            unmet.append(req)
            continue
        needed.add(name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            todo += [d for d in map(Requirement, entry["metadata"].get("requires_dist", []))
                     if d.marker is None or d.marker.evaluate({**env, "extra": extra})]
    return needed, unmet


def unmarked(req: Requirement) -> str:
    """``req`` without its marker: the target's markers were evaluated here; pip would evaluate them again for
    the Python that runs it."""
    copy = Requirement(str(req))
    copy.marker = None
    return str(copy)


def no_wheel(output: str, target: Target, roots: list[str]) -> str | None:
    """pip's "no matching distribution" as what to change, naming the requirement (its pin, where ``roots`` has
    one) and the target. pip says it one of two ways: alone, or, where a constraint names the package too, as a
    conflict "Additionally" (pip 26)."""
    found = re.search(r"No matching distribution found for (\S+)", output)
    listed = re.search(r"no matching distributions available for your environment:\n((?:[ \t]+\S+\n?)+)", output)
    if not (found or listed):
        return None
    req = found[1] if found else listed[1].split()[0]
    name = canonicalize_name(re.split(r"[<>=!~;\[ ]", req)[0])
    req = next((r for r in roots if canonicalize_name(Requirement(r).name) == name), req)
    versions = re.search(r"\(from versions: ([^)]*)\)", output)
    others = f" (the versions that have one: {versions[1]})" if versions and versions[1] != "none" else ""
    return (f"no wheel of {req} for {target}{others}. Name a target PyPI has wheels for (WHEEL_PYTHON, "
            f"WHEEL_PLATFORM) or, where the compute nodes already have {name}, leave it out: WHEEL_EXCLUDE={name}")


def dry_run(requirements: list[str], target: Target, find_links: Path, scratch: Path) -> dict:
    """pip's resolution of ``requirements`` for ``target`` (its ``--report``)."""
    listed, report = scratch / "resolve.txt", scratch / "report.json"
    listed.write_text("".join(f"{r}\n" for r in requirements))
    try:
        pip(["install", "--dry-run", "--ignore-installed", "--report", str(report), *target.pip_args(),
             "--target", str(scratch / "target"),        # writes nothing; pip before 23.3 asks for it with --platform
             "--find-links", str(find_links), "-r", str(listed)], RESOLVE_TIMEOUT)
    except CommandFailed as e:
        raise WheelhouseError(no_wheel(e.output, target, requirements) or str(e)) from None
    return json.loads(report.read_text())


def resolve(roots: list[str], excluded: frozenset[str], target: Target, find_links: Path,
            scratch: Path) -> tuple[dict[str, dict], dict]:
    """Every package the target needs (name → pip's report entry), and the target's marker environment."""
    asked = [r for r in roots if canonicalize_name(Requirement(r).name) not in excluded]
    for _ in range(PASSES):
        report = dry_run(asked, target, find_links, scratch)
        entries = {canonicalize_name(e["metadata"]["name"]): e for e in report["install"]}
        env = target.environment(report["environment"])
        unmet = closure(entries, roots, env, excluded)[1]
        if not unmet:
            return entries, env
        print(f"  {target} also needs {', '.join(map(str, unmet))}: resolving again", flush=True)
        asked += [unmarked(r) for r in unmet]
    raise WheelhouseError(f"pip's resolution still misses what {target} needs: {', '.join(map(str, unmet))}")


# --- building, downloading, the folder ---------------------------------------------------------------------------

def is_pure(wheel: str) -> bool:
    """Whether a wheel's file name says it is pure Python (``py3-none-any``)."""
    python, abi, plat = wheel[: -len(".whl")].split("-")[-3:]
    return abi == "none" and plat == "any" and all(t.startswith("py") for t in python.split("."))


def build_from_source(pins: list[str], excluded: frozenset[str], out: Path) -> None:
    """The pure-Python wheels of the pins PyPI has as source only (:data:`FROM_SOURCE`), into ``out``."""
    for pin in pins:
        name = canonicalize_name(Requirement(pin).name)
        if name not in FROM_SOURCE or name in excluded:
            continue
        settings = FROM_SOURCE[name]
        told = " ".join(f"{k}={v}" for k, v in settings.items())
        print(f"building {pin} into a pure-Python wheel ({told})", flush=True)
        pip(["wheel", "--no-deps", "--no-cache-dir", "--no-binary", name, "--wheel-dir", str(out), pin],
            BUILD_TIMEOUT, {**os.environ, **settings})
        for wheel in out.glob("*.whl"):
            if canonicalize_name(wheel.name.split("-")[0]) == name and not is_pure(wheel.name):
                raise WheelhouseError(f"{pin} built as {wheel.name}, a wheel for one platform: the wheelhouse "
                                      f"needs a pure-Python one ({told})")


def wheel_file(entry: dict) -> str:
    return unquote(Path(urlparse(entry["download_info"]["url"]).path).name)


def file_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetched(folder: Path, entry: dict) -> bool:
    """Whether ``folder`` holds the file of ``entry`` (with its sha256, where pip's report gives one)."""
    file = folder / wheel_file(entry)
    expected = entry["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    return file.is_file() and expected in (None, file_sha256(file))


def fetch(entries: list[dict], folder: Path, target: Target, scratch: Path) -> None:
    """The files of ``entries`` into ``folder``: local ones copied, the others by ``pip download --no-deps``."""
    todo = [e for e in entries if not fetched(folder, e)]
    remote = [e for e in todo if urlparse(e["download_info"]["url"]).scheme != "file"]
    for entry in todo:
        (folder / wheel_file(entry)).unlink(missing_ok=True)       # another build of the same name and version
        if entry not in remote:
            shutil.copy2(unquote(urlparse(entry["download_info"]["url"]).path), folder / wheel_file(entry))
    if remote:
        print(f"downloading {len(remote)} wheels for {target}", flush=True)
        listed = scratch / "download.txt"
        listed.write_text("".join(f"{e['metadata']['name']}=={e['metadata']['version']}\n" for e in remote))
        pip(["download", "--no-deps", "--quiet", "--dest", str(folder), *target.pip_args(), "-r", str(listed)],
            DOWNLOAD_TIMEOUT)
    wrong = [wheel_file(e) for e in todo if not fetched(folder, e)]
    if wrong:
        raise WheelhouseError(f"pip download did not write these files as resolved (missing, or another sha256): "
                              f"{', '.join(wrong)}")


def claim(folder: Path) -> None:
    """Make ``folder`` the wheelhouse, refusing one that holds other files; mark it as being made."""
    if folder.exists() and not folder.is_dir():
        raise WheelhouseError(f"{folder} is a file: name a folder for the wheelhouse (WHEELHOUSE=...)")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MANIFEST).exists():
        raise WheelhouseError(f"{folder} holds files and no {MANIFEST}, so it is no wheelhouse of the course: "
                              "name a new or empty folder (WHEELHOUSE=...)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(INCOMPLETE + "\n")


def tidy(folder: Path, files: set[str]) -> None:
    """Remove the wheels of an earlier build that this one does not have."""
    for wheel in folder.glob("*.whl"):
        if wheel.name not in files:
            wheel.unlink()


def manifest_text(target: Target, pins: list[str], excluded: frozenset[str], left_out: set[str],
                  files: set[str]) -> str:
    lines = ["# A wheelhouse of the DeepSpeed course: `make setup WHEELHOUSE=<this folder>` installs the course",
             "# from it with pip's --no-index, without network. Made by `make wheelhouse`",
             "# (course_utils/tooling/wheelhouse.py).",
             f"made: {date.today().isoformat()} with pip {metadata.version('pip')} on "
             f"Python {platform.python_version()}",
             f"python: {target.python}",
             f"platforms: {' '.join(target.tags())}",
             f"excluded: {' '.join(sorted(excluded))}",
             f"left out with them: {' '.join(sorted(left_out))}"]
    return "\n".join(lines + [f"pin: {p}" for p in pins] + [f"wheel: {f}" for f in sorted(files)]) + "\n"


def read_manifest(folder: Path) -> dict[str, list[str]]:
    """``MANIFEST.txt`` as key → its values, in order."""
    file = folder / MANIFEST
    if not file.is_file():
        raise WheelhouseError(f"{folder} has no {MANIFEST}: it is not a wheelhouse of the course. Make one on a "
                              f"machine with network: make wheelhouse WHEELHOUSE={folder}")
    fields: dict[str, list[str]] = {}
    for line in file.read_text().splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith("#"):
            fields.setdefault(key, []).append(value)
    if "python" not in fields:
        raise WheelhouseError(f"{folder} is a wheelhouse that was never finished: run make wheelhouse again")
    return fields


def build(folder: Path, target: Target, exclude: Iterable[str] = (), requirements: Path = REQUIREMENTS,
          tools: list[str] | None = None) -> dict[str, list[str]]:
    """Write the wheelhouse of ``requirements`` (and of ``tools``, :func:`setup_tools` by default) for ``target``
    into ``folder``; return its manifest."""
    pins = read_requirements(requirements)
    roots = pins + (setup_tools() if tools is None else tools)
    excluded = frozenset(canonicalize_name(n) for n in exclude)
    claim(folder)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        scratch = Path(tmp)
        (built := scratch / "built").mkdir()
        build_from_source(pins, excluded, built)
        print(f"resolving {len(roots)} requirements for {target}", flush=True)
        entries, env = resolve(roots, excluded, target, built, scratch)
        kept, left_out = leave_out(entries, roots, env, excluded)
        fetch([entries[n] for n in sorted(kept)], folder, target, scratch)
    files = {wheel_file(entries[n]) for n in kept}
    tidy(folder, files)
    (folder / MANIFEST).write_text(manifest_text(target, pins, excluded, left_out, files))
    return read_manifest(folder)


def leave_out(entries: dict[str, dict], roots: list[str], env: dict,
              excluded: frozenset[str]) -> tuple[set[str], set[str]]:
    """What goes in, and what is left out with ``excluded`` (what only they need). An exclusion that names
    nothing the roots need is a typo, refused."""
    everything = closure(entries, roots, env)[0]
    unknown = sorted(excluded - everything - {canonicalize_name(Requirement(r).name) for r in roots})
    if unknown:
        raise WheelhouseError(f"WHEEL_EXCLUDE names {', '.join(unknown)}, which the course does not need "
                              "(not in requirements.txt, nor needed by what it lists)")
    kept = closure(entries, roots, env, excluded)[0]
    return kept, everything - kept - excluded


def summary(folder: Path, fields: dict[str, list[str]]) -> str:
    """What the wheelhouse holds (its size measured on disk), for whom, and what it left out."""
    files = [folder / f for f in fields.get("wheel", [])]
    size = sum(f.stat().st_size for f in files) / 1e6
    excluded, left_out = fields["excluded"][0], fields["left out with them"][0]
    lines = [f"{folder}: {len(files)} wheels, {size:.0f} MB, for Python {fields['python'][0]} on "
             f"{fields['platforms'][0].split()[0]} (and the older tags {MANIFEST} lists)"]
    if excluded:
        lines.append(f"  left out: {excluded}" + (f", and what only they need: {left_out}" if left_out else ""))
    return "\n".join(lines)


# --- before an offline install: does the wheelhouse fit this Python and this machine? ----------------------------

def platform_problems(wheels: list[str], here: str | None) -> list[str]:
    """Whether this machine (``here``: its :func:`machine_tag`) runs every wheel: one of each wheel's platform tags
    is ``any`` or one of those ``here`` runs."""
    runs = {"any", *compatible_tags(here)} if here else {"any"}
    unfit = [w for w in wheels if not runs & set(w[: -len(".whl")].split("-")[-1].split("."))]
    if not unfit:
        return []
    shown = ", ".join(unfit[:3]) + (f" and {len(unfit) - 3} more" if len(unfit) > 3 else "")
    if here is None:
        return [f"this machine is no glibc Linux, and the wheelhouse holds wheels for one: {shown}"]
    return [f"wheels of the wheelhouse that do not run on this machine ({here}): {shown}; make it again with "
            f"WHEEL_PLATFORM={here}"]


def excluded_problems(name: str, pins: list[str]) -> list[str]:
    """Whether this Python has ``name``, which the wheelhouse left out, in the version requirements.txt pins."""
    pin = next((p for p in pins if canonicalize_name(Requirement(p).name) == name), None)
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        return [f"{name} was left out of the wheelhouse (WHEEL_EXCLUDE) and this Python ({sys.prefix}) has none: "
                f"install it there first, or, where the system's Python has it, make .venv see it: "
                f"rm -rf .venv && python3 -m venv --system-site-packages .venv"]
    if pin and not Requirement(pin).specifier.contains(version, prereleases=True):
        return [f"{name} {version} is installed and requirements.txt pins {pin}, which the wheelhouse left out: "
                f"install {pin} (this machine's build of it) first, or make the wheelhouse without "
                f"WHEEL_EXCLUDE={name}"]
    return []


def check(folder: Path, requirements: Path = REQUIREMENTS) -> list[str]:
    """What stops an offline install from ``folder`` into this Python: empty when nothing does."""
    fields, pins = read_manifest(folder), read_requirements(requirements)
    problems = []
    if fields["python"] != [this_python()]:
        problems.append(f"the wheelhouse was made for Python {fields['python'][0]}; this is Python {this_python()} "
                        f"({sys.executable}): make it again with WHEEL_PYTHON={this_python()}")
    problems += platform_problems(fields.get("wheel", []), machine_tag())
    if fields.get("pin", []) != pins:
        changed = sorted(set(pins) ^ set(fields.get("pin", [])))
        problems.append(f"{requirements.name} has changed since the wheelhouse was made "
                        f"({', '.join(changed) or 'the order of its lines'}): make it again (make wheelhouse)")
    for name in fields["excluded"][0].split():
        problems += excluded_problems(name, pins)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tooling.wheelhouse",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the wheels of requirements.txt for a target into FOLDER (make wheelhouse)")
    b.add_argument("folder", type=Path)
    b.add_argument("--python", type=python_version, default=this_python(),
                   help="the compute nodes' Python, e.g. 3.12 (default: this one's)")
    b.add_argument("--platform", nargs="+", metavar="TAG",
                   help="their platform tag(s), e.g. manylinux_2_28_x86_64 (default: this machine's); each "
                        "manylinux tag brings every older one")
    b.add_argument("--exclude", nargs="+", default=[], metavar="NAME",
                   help="packages they already have (torch on a CUDA image), left out with what only they need")
    c = sub.add_parser("check", help="before an offline install: does FOLDER fit this Python, this machine and "
                                     "requirements.txt?")
    c.add_argument("folder", type=Path)
    for p in (b, c):
        p.add_argument("--requirements", type=Path, default=REQUIREMENTS, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    said = "make wheelhouse" if a.command == "build" else f"WHEELHOUSE={a.folder}"
    try:
        return (run_build if a.command == "build" else run_check)(a)
    except WheelhouseError as e:
        print(f"{said}: {e}", file=sys.stderr)
        return 1


def run_build(a: argparse.Namespace) -> int:
    fields = build(a.folder, Target(a.python, tuple(a.platform or [this_platform()])), a.exclude, a.requirements)
    print(summary(a.folder, fields))
    print("  copy the folder to the compute nodes; there: make setup WHEELHOUSE=<the folder>")
    return 0


def run_check(a: argparse.Namespace) -> int:
    problems = check(a.folder, a.requirements)
    for problem in problems:
        print(f"WHEELHOUSE={a.folder}: {problem}", file=sys.stderr)
    if not problems:
        print(summary(a.folder, read_manifest(a.folder)) + "\n  it fits: installing from it with pip's --no-index")
    return 1 if problems else 0

if __name__ == "__main__":
    sys.exit(main())
