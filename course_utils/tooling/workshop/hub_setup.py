"""Setting up the workshop server for :mod:`.hub`: the roster, the password, the preflight (can this server hold the
roster?), a Unix user per participant, and the folders above the course that the users must be able to enter.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from course_utils.common import paths

# What one participant needs, measured on notebook 00's and 05's launches (two CPU ranks each; see INSTRUCTORS.md)
CORES_PER_PARTICIPANT = 1
RAM_PER_PARTICIPANT_GIB = 2.5
SHM_PER_PARTICIPANT_GIB = 0.5
NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")


def folder() -> Path:
    """The hub's folder: ``build/hub``."""
    return paths.build_dir() / "hub"


def read_roster(path: Path) -> list[str]:
    """The participants' user names, one a line (blank lines and ``#`` comments skipped)."""
    names = [line.split("#")[0].strip() for line in Path(path).read_text().splitlines()]
    names = [n for n in names if n]
    bad = [n for n in names if not NAME.match(n)]
    if bad:
        raise SystemExit(f"{path}: not a Unix user name (lower case, digits, - and _): {', '.join(bad)}")
    if len(set(names)) != len(names) or not names:
        raise SystemExit(f"{path}: {'a name is listed twice' if names else 'no participant listed'}")
    return names


def read_password(password_file: str | None = None) -> str:
    """The participants' shared password: from ``password_file``, ``$HUB_PASSWORD_FILE`` or ``$HUB_PASSWORD``."""
    source = password_file or os.environ.get("HUB_PASSWORD_FILE")
    password = Path(source).read_text().strip() if source else os.environ.get("HUB_PASSWORD", "").strip()
    if len(password) < 8:
        raise SystemExit("No workshop password (8 characters or more): put it in a file only root can read and run "
                         "`make hub HUB_PASSWORD_FILE=<file>` (or set HUB_PASSWORD). There is no default password.")
    return password


def preflight(participants: int) -> list[str]:
    """What keeps this server from holding ``participants`` (empty: it can): cores, RAM, /dev/shm, tools, and a
    course the users can read."""
    problems = []
    cores = len(os.sched_getaffinity(0))
    ram = psutil.virtual_memory().total / 2**30
    shm = shutil.disk_usage("/dev/shm").total / 2**30 if Path("/dev/shm").is_dir() else 0.0
    for what, have, per, unit in (("cores", cores, CORES_PER_PARTICIPANT, ""), ("RAM", ram, RAM_PER_PARTICIPANT_GIB,
                                  " GiB"), ("/dev/shm", shm, SHM_PER_PARTICIPANT_GIB, " GiB")):
        if have < per * participants:
            problems.append(f"{what}: {have:.4g}{unit} here, {participants} participants need {per * participants:g}"
                            f"{unit} ({per:g}{unit} each)")
    problems += [f"`{tool}` is missing (Debian: apt-get install {pkg})" for tool, pkg in
                 (("taskset", "util-linux"), ("useradd", "passwd"), ("runuser", "util-linux")) if not shutil.which(tool)]
    problems += [f"{p} is closed to other users, and every participant runs the course's Python from under it: "
                 "OPEN=1 (--open-paths) lets them through it (o+x) while the hub runs" for p in closed_paths()]
    return problems


def closed_paths() -> list[Path]:
    """The folders above the course, its environment, the interpreter and ``build/`` that other users cannot
    enter (no o+x): a course in /root, or a Python installed there by pyenv."""
    wanted = [paths.ROOT, Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent, Path(sys.base_prefix),
              paths.build_dir()]
    closed = {p for w in wanted for p in [w.resolve(), *w.resolve().parents]
              if p.exists() and not os.stat(p).st_mode & 0o001}
    return sorted(closed)


def open_paths(closed: list[Path]) -> None:
    """Give other users the right to pass through ``closed`` (o+x: enter, not list), recording the modes that
    ``stop`` puts back."""
    record = folder() / "state" / "opened.json"
    before = json.loads(record.read_text()) if record.exists() else {}
    for path in closed:
        before.setdefault(str(path), os.stat(path).st_mode & 0o7777)
        path.chmod(os.stat(path).st_mode | 0o001)
    record.write_text(json.dumps(before))


def close_paths() -> None:
    record = folder() / "state" / "opened.json"
    if record.exists():
        for path, mode in json.loads(record.read_text()).items():
            Path(path).chmod(mode)
        record.unlink()


def ensure_user(name: str, home: Path) -> pwd.struct_passwd:
    """The Unix user ``name`` (created with its home ``home``, readable by itself only, when it does not exist)."""
    if os.geteuid() != 0:
        raise SystemExit("`make hub` creates a Unix user per participant: run it as root (sudo make hub ...).")
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group",
                        name], check=True, capture_output=True, text=True)
        user = pwd.getpwnam(name)
    home = Path(user.pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, user.pw_uid, user.pw_gid)
    home.chmod(0o700)
    return user


def remove_users(names: list[str]) -> None:
    """``userdel --remove`` each of ``names`` that exists (their homes go with them)."""
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)


def share_ops(user: pwd.struct_passwd, into: Path) -> Path:
    """The course's prebuilt DeepSpeed ops for ``user`` in a folder of their own (``TORCH_EXTENSIONS_DIR``): torch
    locks an op's folder (a file in it) each time it loads the op, so each user needs a folder they can write; the
    built libraries and objects stay the course's (links), the small build files are copied with their times, so
    ninja finds every op up to date and nothing is built again."""
    shared = paths.torch_extensions_dir()
    for source in [shared, *sorted(shared.rglob("*"))] if shared.is_dir() else []:
        target = into / source.relative_to(shared)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif source.suffix in (".so", ".o"):
            if not target.is_symlink():
                target.unlink(missing_ok=True)
                target.symlink_to(source)
            continue
        else:
            shutil.copy2(source, target)
        os.lchown(target, user.pw_uid, user.pw_gid)
    into.mkdir(parents=True, exist_ok=True)
    os.chown(into, user.pw_uid, user.pw_gid)
    return into
