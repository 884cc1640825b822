"""``make hub`` / ``make hub-stop``: a workshop on one shared server, JupyterHub in front of nbgrader's exchange.

``python -m course_utils.tooling.workshop.hub start --roster roster.txt`` (as root) checks that the server can hold the
roster (cores, RAM, ``/dev/shm``), creates a Unix user per participant and one for the instructor (nbgrader knows a
student by their Unix user), writes the hub's configuration (:mod:`.hub_config`) and starts JupyterHub with its proxy,
the idle culler and the local-process spawner; everything lives under ``build/hub/``: the homes (each readable by its
owner only), nbgrader's exchange, the hub's state and log. The course itself stays where it is, owned by root and
read-only to the users, its kernel and prebuilt DeepSpeed ops shared by all. The hub listens on loopback unless
``--ip`` says otherwise. ``stop`` ends the hub, the proxy, every single-user server and whatever the users still run
(a launch's ranks included); users are removed only with ``--remove-users``.

The password every participant types is read from ``HUB_PASSWORD_FILE`` (or ``HUB_PASSWORD``); without one the hub
does not start. The instructor logs in with a password of their own (admin users need 32 characters), read from
``HUB_ADMIN_PASSWORD_FILE`` or made at the first start and kept in ``build/hub/state/admin_password`` (root only).
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from course_utils.common import paths, reaper
from course_utils.kernel.launch.commands import free_port
from course_utils.kernel.launch.processes import die_with_parent
from course_utils.tooling.workshop import hub_config
from course_utils.tooling.workshop.hub_setup import (CORES_PER_PARTICIPANT, NAME, close_paths, closed_paths,
    ensure_user, folder, open_paths, preflight, read_password, read_roster, remove_users, share_ops)

START_TIMEOUT = 90      # seconds for the hub to answer (its proxy and its database start first)


def shares(participants: list[str], instructor: str, base: Path) -> dict[str, dict]:
    """Each user's cores (a ``taskset -c`` list) and environment: threads per rank (a launch starts two), the build
    folder in their home, the Jupyter configuration of their role, the exchange. Participants get disjoint slices of
    the cores while there are enough; the instructor, who grades, gets all."""
    cores = sorted(os.sched_getaffinity(0))
    # the ninja that built the course's ops comes first (torch runs the one on the PATH each time it loads an op, and
    # another version would not read its build log and build them all again); the course's commands come last
    ninja = Path(shutil.which("ninja") or "/usr/bin/ninja").parent
    path = ":".join(dict.fromkeys([str(ninja), "/usr/local/bin", "/usr/bin", "/bin", str(hub_config.BIN)]))
    each = max(CORES_PER_PARTICIPANT, len(cores) // max(1, len(participants)))
    out = {}
    for i, name in enumerate([*participants, instructor]):
        mine = [cores[(i * each + k) % len(cores)] for k in range(min(each, len(cores)))] if name != instructor \
            else cores
        role = "instructor" if name == instructor else "participant"
        out[name] = {"cpus": ",".join(map(str, mine)), "env": {
            "PATH": path, "OMP_NUM_THREADS": str(max(1, len(mine) // 2)),
            "COURSE_BUILD_DIR": str(base / "homes" / name / "build"), "JUPYTER_CONFIG_PATH": str(base / "etc" / role),
            "TORCH_EXTENSIONS_DIR": str(base / "homes" / name / "build" / "torch_extensions"),
            hub_config.EXCHANGE_ENV: str(base / "exchange")}}
    return out


def user_argv(name: str, argv: list[str]) -> list[str]:
    """``argv`` run as the workshop user ``name``, on their cores, with their environment (their server's)."""
    settings = json.loads((folder() / "hub.json").read_text())
    mine, user = settings["shares"][name], pwd.getpwnam(name)
    env = {"HOME": user.pw_dir, "USER": name, "LOGNAME": name, "SHELL": "/bin/bash", "LANG": "C.UTF-8", **mine["env"]}
    return ["runuser", "-u", name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
            "taskset", "-c", mine["cpus"], *argv]


def as_user(name: str, argv: list[str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``argv`` as the workshop user ``name`` (:func:`user_argv`), in their home unless ``cwd``; the output is
    captured as text."""
    return subprocess.run(user_argv(name, argv), cwd=cwd or pwd.getpwnam(name).pw_dir, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _secret(path: Path, value: str | None = None) -> Path:
    """A root-only file holding ``value`` (a new random one when the file does not exist yet and none is given)."""
    if value is not None or not path.exists():
        path.touch(mode=0o600)
        path.write_text(value if value is not None else secrets.token_hex(24))
    path.chmod(0o600)
    return path


@dataclass
class Hub:
    """A running hub: its URL, its service token (for the REST API) and its settings."""
    url: str
    token: str
    settings: dict
    pid: int

    def api(self, method: str, path: str, body: dict | None = None) -> dict | None:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}/hub/api{path}", data=data, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
        return json.loads(text) if text else None


def start(roster: Path, instructor: str = "instructor", ip: str = "127.0.0.1", port: int = 8000,
          password_file: str | None = None, idle_timeout: int = 3600, force: bool = False,
          tied: bool = False, open_closed: bool = False) -> Hub:
    """Start the workshop's hub (see the module's docstring). ``tied``: the hub dies with this process (the tests);
    otherwise it runs on until ``stop``. ``force``: start even when the preflight finds the server too small.
    ``open_closed``: let the users through the folders :func:`closed_paths` finds (``stop`` closes them again)."""
    participants = read_roster(roster)
    if instructor in participants or not NAME.match(instructor):
        raise SystemExit(f"the instructor's user name {instructor!r} must be a Unix name not on the roster")
    password = read_password(password_file)
    if running():
        raise SystemExit(f"a hub already runs from {paths.relative(folder())}: `make hub-stop` first")
    base = folder()
    for path, mode in ((base, 0o755), (base / "state", 0o700), (base / "homes", 0o755)):
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
    if open_closed and os.geteuid() == 0:
        open_paths(closed_paths())
    try:
        problems = preflight(len(participants))
        if problems and not force:
            raise SystemExit("This server cannot hold the roster:\n  " + "\n  ".join(problems)
                             + "\n(FORCE=1 starts anyway)")
        settings = _prepare(base, participants, instructor, password)
        settings.update(ip=ip, port=port, idle_timeout=idle_timeout)
        return _launch(base, settings, tied)
    except BaseException:
        stop()
        raise


def _prepare(base: Path, participants: list[str], instructor: str, password: str) -> dict:
    """The users, their homes and build folders, the exchange, the secrets: the hub's settings (addresses aside)."""
    state, homes, exchange = base / "state", base / "homes", base / "exchange"
    users = {name: ensure_user(name, homes / name) for name in [*participants, instructor]}
    exchange.mkdir(exist_ok=True)
    os.chown(exchange, users[instructor].pw_uid, users[instructor].pw_gid)
    exchange.chmod(0o1777)      # nbgrader's exchange: everyone writes, nobody removes another's folder
    for user in users.values():
        build = Path(user.pw_dir) / "build"
        build.mkdir(exist_ok=True)
        os.chown(build, user.pw_uid, user.pw_gid)
        share_ops(user, build / "torch_extensions")
    admin_file = os.environ.get("HUB_ADMIN_PASSWORD_FILE")
    return {
        "hub_port": free_port(), "proxy_api_port": free_port(), "bin": str(hub_config.BIN),
        "state": str(state), "homes": str(homes), "exchange": str(exchange), "participants": participants,
        "instructor": instructor, "instructor_course": str(Path(users[instructor].pw_dir) / "build" / "nbgrader"),
        "password_file": str(_secret(state / "password", password)),
        "admin_password_file": str(_secret(state / "admin_password",
                                           Path(admin_file).read_text().strip() if admin_file else None)),
        "token_file": str(_secret(state / "service_token")),
        "shares": shares(participants, instructor, base),
    }


def _launch(base: Path, settings: dict, tied: bool) -> Hub:
    """Write the configuration, start JupyterHub (it starts its proxy and the idle culler), wait until it answers."""
    config, state = hub_config.write(base, settings), base / "state"
    with open(state / "jupyterhub.log", "ab") as log:
        process = subprocess.Popen([str(hub_config.BIN / "jupyterhub"), "-f", str(config)], cwd=state,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=die_with_parent if tied else None)
    record_file().write_text(json.dumps({"pid": process.pid, "started": psutil.Process(process.pid).create_time(),
                                    "users": [*settings["participants"], settings["instructor"]]}))
    host = "127.0.0.1" if settings["ip"] in ("0.0.0.0", "", "::") else settings["ip"]
    hub = Hub(f"http://{host}:{settings['port']}", (state / "service_token").read_text(), settings, process.pid)
    _wait_until_up(hub, process, state / "jupyterhub.log")
    return hub


def _wait_until_up(hub: Hub, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            hub.api("GET", "/")
            return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"JupyterHub did not start{' (it exited)' if process.poll() is not None else ''}; "
                               f"its log ({paths.relative(log)}) ends:\n{tail}")
        time.sleep(0.3)


def record_file() -> Path:
    """What ``start`` started (the hub's pid and start time, the users), for ``stop``."""
    return folder() / "state" / "running.json"


def _record() -> dict | None:
    path = record_file()
    return json.loads(path.read_text()) if path.exists() else None


def running() -> psutil.Process | None:
    """The hub process ``start`` left running, if it still runs."""
    record = _record()
    try:
        process = psutil.Process(record["pid"]) if record else None
        return process if process and abs(process.create_time() - record["started"]) < 1 else None
    except psutil.NoSuchProcess:
        return None


def leftovers(users: list[str] | None = None) -> list[psutil.Process]:
    """Processes of the workshop's users, or whose command line names the hub's folder or its proxy's port (the
    proxy), or whose environment names the hub's API (the idle culler, the single-user servers)."""
    users = users if users is not None else (_record() or {}).get("users", [])
    uids = {u.pw_uid for u in map(_user, users) if u}
    settings = folder() / "hub.json"
    ports = json.loads(settings.read_text()) if settings.exists() else {}
    marks = [str(folder()), *([f"--api-port {ports['proxy_api_port']}"] if ports else [])]
    api = f"127.0.0.1:{ports['hub_port']}/" if ports else None
    found = []
    for p in psutil.process_iter(["uids", "cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
            if p.info["uids"].real in uids or any(m in line for m in marks) or \
                    (api and api in p.environ().get("JUPYTERHUB_API_URL", "")):
                found.append(p)
        except (psutil.Error, TypeError):
            pass
    return [p for p in found if p.pid != os.getpid()]


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def stop(remove: bool = False, grace: float = 20.0) -> list[int]:
    """End the hub (SIGTERM: it stops the single-user servers and its proxy itself; SIGKILL after ``grace``
    seconds), then kill whatever of it or its users is left; with ``remove`` the users and their homes go too.
    Returns the pids that had to be killed."""
    record = _record() or {}
    hub = running()
    tree = reaper.tree(hub.pid) if hub else []
    if hub:
        reaper.end(lambda: [hub.pid] if reaper.alive(hub.pid) else [], grace=grace)
    rest = sorted(p for p in {*tree, *(q.pid for q in leftovers(record.get("users", [])))} if reaper.alive(p))
    reaper.end(lambda: [p for p in rest if reaper.alive(p)], at_once=True)
    record_file().unlink(missing_ok=True)
    close_paths()
    if remove:
        remove_users(record.get("users", []))
    return rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tooling.workshop.hub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("start", help="start the workshop's hub (as root)")
    go.add_argument("--roster", type=Path, required=True, help="one participant's user name a line")
    go.add_argument("--instructor", default="instructor", help="the instructor's user name (default: instructor)")
    go.add_argument("--ip", default="127.0.0.1", help="address to listen on (default: loopback only)")
    go.add_argument("--port", type=int, default=8000)
    go.add_argument("--password-file", help="the participants' password (default: $HUB_PASSWORD_FILE, $HUB_PASSWORD)")
    go.add_argument("--idle-timeout", type=int, default=3600, help="seconds before an idle server is stopped")
    go.add_argument("--force", action="store_true", help="start even if the preflight finds the server too small")
    go.add_argument("--open-paths", action="store_true", help="let the users through the folders above the course "
                    "and its Python that are closed to them (o+x; `stop` closes them again)")
    end = sub.add_parser("stop", help="stop everything `start` started")
    end.add_argument("--remove-users", action="store_true", help="also remove the users and their homes")
    a = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the hub runs a Unix user per participant: run it as root (sudo make hub / sudo make hub-stop)")
    if a.command == "stop":
        killed = stop(a.remove_users)
        print("hub stopped" + (f"; killed what was left: {killed}" if killed else ""))
        return 0
    hub = start(a.roster, a.instructor, a.ip, a.port, a.password_file, idle_timeout=a.idle_timeout, force=a.force,
                open_closed=a.open_paths)
    state = paths.relative(folder() / "state")
    print(f"JupyterHub runs at {hub.url} (log: {state}/jupyterhub.log); participants log in with the workshop "
          f"password, the instructor ({a.instructor}) with the one in {state}/admin_password. `make hub-stop` ends it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
