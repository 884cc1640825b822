"""The one runner: every multi-rank launch in the course goes through :func:`deepspeed`.

It runs the real ``deepspeed`` command line launcher as a subprocess in its own process group,
streams each rank's output live with a ``[rank N]`` prefix, and returns the full log and the
figures the script recorded. It checks the config before any rank starts, names the rank that
failed (with its traceback), and on a timeout, an error or a notebook interrupt kills the whole
process group, so no rank outlives the cell that started it.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import psutil

from . import configs, hardware, paths
from .record import read_records

DEFAULT_TIMEOUT = 600
_RANK_HOOK = Path(__file__).parent / "rank_hook"
_DS_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[(INFO|DEBUG)\]")
_TAIL_LINES = 25


class LaunchError(RuntimeError):
    """A launch that failed or timed out; ``.result`` holds the logs of every rank."""

    def __init__(self, message: str, result: "LaunchResult"):
        super().__init__(message)
        self.result = result


@dataclass
class LaunchResult:
    returncode: int
    log: str                      # everything the launch printed, rank-prefixed
    records: list[dict]           # every record() call: {"name", "value", "rank"}
    run_dir: Path
    command: str                  # the equivalent shell command
    seconds: float
    world_size: int
    rank_logs: dict[int, str] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, Any]:
        """name → value, from the lowest rank that recorded it (the last value if recorded twice)."""
        out: dict[str, Any] = {}
        for rec in sorted(self.records, key=lambda r: -r["rank"]):   # stable: keeps each rank's order
            out[rec["name"]] = rec["value"]
        return out

    def per_rank(self, name: str) -> dict[int, Any]:
        """rank → value of ``name`` (the last one each rank recorded)."""
        return {rec["rank"]: rec["value"] for rec in self.records if rec["name"] == name}

    def series(self, name: str, rank: int = 0) -> list[Any]:
        """Every value of ``name`` recorded by ``rank``, in order (a loss curve, say)."""
        return [rec["value"] for rec in self.records if rec["name"] == name and rec["rank"] == rank]


def free_port() -> int:
    """A TCP port the kernel just handed out and nobody holds: one per launch, so launches never clash."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deepspeed_cli() -> str:
    exe = Path(sys.executable).parent / "deepspeed"
    if exe.exists():
        return str(exe)
    found = shutil.which("deepspeed")
    if not found:
        raise FileNotFoundError("The `deepspeed` command is not installed in this environment: run `make setup`.")
    return found


def _resolve_script(script: str | Path) -> Path:
    path = Path(script)
    for candidate in (path, paths.SCRIPTS / path, paths.ROOT / path):
        if candidate.is_file():
            return candidate.resolve()
    available = ", ".join(sorted(p.name for p in paths.SCRIPTS.glob("*.py")))
    raise FileNotFoundError(f"Script {script} not found (looked in {paths.relative(paths.SCRIPTS)}/ too). "
                            f"Scripts of the course: {available}")


def _new_run_dir(script: Path, name: str | None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = paths.runs_dir() / f"{stamp}-{name or script.stem}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(parents=True)
    return run_dir


def _commands(script: Path, script_args: list[str], procs: int, nodes: int, port: int,
              run_dir: Path) -> list[list[str]]:
    """One ``deepspeed`` command per simulated node (one in the usual single-machine case)."""
    cli = _deepspeed_cli()
    common = ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    if nodes == 1:
        return [[cli, "--num_gpus", str(procs), *common, "--enable_each_rank_log",
                 paths.relative(run_dir / "ranks"), paths.relative(script), *script_args]]
    hostfile = run_dir / "hostfile"
    hostfile.write_text("".join(f"node{n} slots={procs}\n" for n in range(nodes)))
    return [[cli, "--hostfile", paths.relative(hostfile), "--no_ssh", "--node_rank", str(n), *common,
             "--enable_each_rank_log", paths.relative(run_dir / "ranks"), paths.relative(script), *script_args]
            for n in range(nodes)]


def _environment(run_dir: Path, world_size: int, extra: dict | None) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["COURSE_RUN_DIR"] = str(run_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_RANK_HOOK), str(paths.ROOT), env.get("PYTHONPATH")) if p)
    if not hardware.detect().is_gpu:     # share the cores instead of every rank spinning on all of them
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


class _Streams:
    """Collects launcher output (pipes) and rank output (per-rank log files) into one prefixed stream."""

    def __init__(self, procs: list[subprocess.Popen], ranks_dir: Path):
        self.lines: queue.Queue[str] = queue.Queue()
        self.ranks_dir = ranks_dir
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, str] = {}
        self.rank_text: dict[int, list[str]] = {}
        self.readers = [threading.Thread(target=self._pump, args=(p, i, len(procs)), daemon=True)
                        for i, p in enumerate(procs)]
        for t in self.readers:
            t.start()

    def _pump(self, proc: subprocess.Popen, node: int, nodes: int) -> None:
        prefix = "[launcher]" if nodes == 1 else f"[launcher node{node}]"
        for line in proc.stdout:
            self.lines.put(f"{prefix} {line.rstrip()}")

    def poll_rank_logs(self, final: bool = False) -> None:
        for path in sorted(self.ranks_dir.glob("*_rank*.log")):
            rank = int(path.stem.rsplit("_rank", 1)[1])
            with open(path, errors="replace") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
                self.offsets[path] = f.tell()
            text = self.partial.pop(path, "") + chunk
            parts = text.split("\n")
            last = parts.pop()
            if not final:
                self.partial[path] = last
            elif last:
                parts.append(last)
            for line in parts:
                self.rank_text.setdefault(rank, []).append(line)
                self.lines.put(f"[rank {rank}] {line}")

    def drain(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                return out


def _die_with_parent() -> None:
    """Runs in the child before exec: deliver SIGTERM to it if the process that started it dies.

    Without it, a kernel killed outright (a restart, an OOM kill) leaves its launches running, since
    none of our Python code gets the chance to clean up. Linux only; elsewhere a no-op.
    """
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# The launch's watchdog: a tiny process that gets SIGTERM when the kernel that started the launch dies
# (see _die_with_parent) and then kills the launch's process groups. The deepspeed CLI does not forward
# SIGTERM to its launcher on a single node, so killing the CLI alone would orphan the ranks.
_WATCHDOG = """
import os, signal, sys, time
groups = [int(g) for g in sys.argv[1:]]
def end(*_):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass
        time.sleep(3)
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
while True:
    time.sleep(1)
"""


def _start_watchdog(procs: list[subprocess.Popen]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, *(str(p.pid) for p in procs)],
                            preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)


def _signal_groups(procs: Iterable[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to the process group of each launcher (each was started in a session of its own)."""
    for p in procs:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process of the launch (its groups and all descendants), then SIGKILL what is left."""
    victims: list[psutil.Process] = []
    for p in procs:
        try:
            parent = psutil.Process(p.pid)
            victims += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    _signal_groups(procs, signal.SIGTERM)
    for v in victims:          # descendants that left the group (a rank calling setsid) are reached too
        try:
            v.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(victims, timeout=5)
    for v in alive:
        try:
            v.kill()
        except psutil.NoSuchProcess:
            pass
    _signal_groups(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def release_shm_buffers(port: int) -> None:
    """Remove the shared-memory buffers DeepSpeed's CPU all-reduce (shm comm op) leaves behind.

    Each CPU rank creates /dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank> (about 66 MB)
    and DeepSpeed never unlinks it (shm.cpp's shared_close is not called), so every launch would keep
    ~66 MB per rank of RAM until reboot. The port is unique per launch, so these are this launch's own.
    """
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*"):
        try:
            path.unlink()
        except OSError:
            pass


def _first_failure(run_dir: Path, rank_logs: dict[int, str]) -> tuple[int | None, str]:
    """The rank that died first and its traceback: from the rank hook's records, else from the logs."""
    records = []
    for path in (run_dir / "failures").glob("rank*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            pass
    if records:
        first = min(records, key=lambda r: r["time"])
        return int(first["rank"]), first["traceback"]
    for rank, text in sorted(rank_logs.items()):
        if "Traceback (most recent call last)" in text:
            return rank, text[text.index("Traceback (most recent call last)"):]
    return None, ""


def _tail(text: str, n: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def deepspeed(script: str | Path, *script_args: Any, procs: int | None = None, config: dict | str | Path | None = None,
              timeout: float = DEFAULT_TIMEOUT, env: dict | None = None, nodes: int = 1, name: str | None = None,
              trainer: bool = False, config_arg: str = "--deepspeed_config", check: bool = True,
              verbose: bool = False, quiet: bool = False) -> LaunchResult:
    """Launch ``script`` on ``procs`` ranks (per node) with the real ``deepspeed`` launcher.

    - ``procs``: ranks per node; default one per GPU, or 2 CPU ranks without a GPU.
    - ``config``: a DeepSpeed config (dict, or a path; bare names are looked up in ``configs/``). It is
      validated for the launch's world size first and passed to the script as ``config_arg <path>``.
      ``trainer=True`` allows the "auto" values that the HF Trainer fills (the script hands the path to
      ``TrainingArguments(deepspeed=...)``).
    - ``nodes``: simulate several nodes on this machine (one launcher per node, ``--no_ssh``).
    - ``timeout``: seconds until every process of the launch is killed and :class:`LaunchError` raised.
    - ``check``: raise :class:`LaunchError` when a rank fails (else return the result with its returncode).
    - ``verbose``: also stream DeepSpeed's INFO lines (they are always in ``result.log``); ``quiet``: stream nothing.
    """
    script_path = _resolve_script(script)
    procs = procs or hardware.detect().default_procs
    world_size = procs * nodes
    run_dir = _new_run_dir(script_path, name)
    args = [str(a) for a in script_args]
    if config is not None:
        cfg = configs.validate(config, world_size=world_size, trainer=trainer)
        is_file = not isinstance(config, dict)
        cfg_path = Path(configs.load(config)[1]) if is_file else run_dir / "ds_config.json"
        if not is_file:
            cfg_path.write_text(json.dumps(cfg, indent=2))
        args += [config_arg, paths.relative(cfg_path)]
    port = free_port()
    commands = _commands(script_path, args, procs, nodes, port, run_dir)
    shown = "\n".join(f"cd {shlex.quote(str(paths.ROOT))} && " + shlex.join(["deepspeed", *c[1:]]) for c in commands)
    if not quiet:
        print(f"$ {shown}", flush=True)

    environment = _environment(run_dir, world_size, env)
    started = time.monotonic()
    procs_: list[subprocess.Popen] = []
    watchdog: subprocess.Popen | None = None
    log_lines: list[str] = []
    timed_out = False
    try:
        for cmd in commands:
            procs_.append(subprocess.Popen(cmd, cwd=paths.ROOT, env=environment, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, errors="replace",
                                           start_new_session=True))
        watchdog = _start_watchdog(procs_)
        streams = _Streams(procs_, run_dir / "ranks")

        def emit(lines: list[str]) -> None:
            for line in lines:
                log_lines.append(line)
                if not quiet and (verbose or not _DS_LOG_LINE.match(line.split("] ", 1)[-1])):
                    print(line, flush=True)

        while True:
            streams.poll_rank_logs()
            emit(streams.drain())
            codes = [p.poll() for p in procs_]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0) for c in codes):   # one simulated node failed: its peers would hang
                _kill_group(procs_)
                break
            if time.monotonic() - started > timeout:
                timed_out = True
                _kill_group(procs_)
                break
            time.sleep(0.1)
        for t in streams.readers:
            t.join(timeout=5)
        streams.poll_rank_logs(final=True)
        emit(streams.drain())
    except BaseException:
        _kill_group(procs_)
        raise
    finally:
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        release_shm_buffers(port)

    _signal_groups(procs_, signal.SIGKILL)   # anything a rank left behind in the launch's groups goes too
    seconds = time.monotonic() - started
    codes = [p.returncode for p in procs_]
    returncode = 124 if timed_out else next((c for c in codes if c != 0), 0)
    rank_logs = {r: "\n".join(lines) for r, lines in streams.rank_text.items()}
    (run_dir / "launch.log").write_text("\n".join(log_lines) + "\n")
    result = LaunchResult(returncode=returncode, log="\n".join(log_lines), records=read_records(run_dir),
                          run_dir=run_dir, command=shown, seconds=seconds, world_size=world_size,
                          rank_logs=rank_logs)
    if returncode != 0 and check:
        raise LaunchError(_failure_message(result, timed_out, timeout), result)
    if not quiet:
        print(f"✔ {world_size} ranks finished in {seconds:.1f} s — logs: {paths.relative(run_dir)}/", flush=True)
    return result


def _failure_message(result: LaunchResult, timed_out: bool, timeout: float) -> str:
    where = f"Logs: {paths.relative(result.run_dir)}/launch.log and ranks/."
    if timed_out:
        tails = "\n".join(f"--- rank {r} (last lines) ---\n{_tail(t, 8)}" for r, t in sorted(result.rank_logs.items()))
        return (f"Launch timed out after {timeout:.0f} s and every process of it was killed. A rank stuck "
                f"in a collective (all_reduce, barrier, ...) that another rank never reached looks like "
                f"this; so does a run that needs a longer timeout=.\n{tails}\n{where}")
    rank, trace = _first_failure(result.run_dir, result.rank_logs)
    if rank is None:
        return (f"Launch failed (exit code {result.returncode}) without a Python traceback (a rank exited "
                f"with an error status or was killed); the end of the log:\n{_tail(result.log)}\n{where}")
    return f"Rank {rank} failed (launch exit code {result.returncode}):\n{_tail(trace)}\n{where}"


def command(args: list[str], timeout: float = 300, cwd: Path | None = None, env: dict | None = None) -> str:
    """Run a single-process tool of the stack (``ds_report``, ``accelerate``, a converter script) and
    return its output; on a timeout or a non-zero exit its whole process group is killed and a
    ``RuntimeError`` names the command and shows the end of what it printed."""
    tool = Path(sys.executable).parent / args[0]
    argv = [str(tool) if tool.exists() else args[0], *map(str, args[1:])]
    proc = subprocess.Popen(argv, cwd=cwd or paths.ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
                            preexec_fn=_die_with_parent)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group([proc])
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"`{shlex.join(map(str, args))}` exited with {proc.returncode}:\n{_tail(out)}")
    return out
