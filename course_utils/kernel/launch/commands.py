"""The command lines of a launch: which script, which ``deepspeed`` executable, which flags.

Everything here is decided before any process starts, so a bad script name or config fails in the
notebook cell with a clear message instead of inside the ranks, and the learner sees the exact shell
command they could type themselves (``$ cd ... && deepspeed ...``).
"""
from __future__ import annotations

import json
import random
import shlex
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

from course_utils.kernel import configs
from course_utils.common import paths, run_folder
from course_utils.kernel.launch.environment import ssh_environment, write_env_file
from course_utils.kernel.launch.options import LaunchOptions


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
# The ports this process handed out most recently, each claimed among every process on this machine (see _claim).
_claims: list[socket.socket] = []
CLAIMS_KEPT = 64


def _claim(port: int) -> bool:
    """Reserve ``port`` against the course's other processes on this machine (two notebooks side by side, a test
    worker beside another): an abstract Unix socket named after the port, which one process at a time can hold and
    which goes with its process (nothing on disk to remove). Two kernels once picked the same free port within the
    seconds before either launch's rank 0 bound it, and one launch failed with "EADDRINUSE". Once a rank has bound
    the port, binding it fails for everyone else: the last :data:`CLAIMS_KEPT` claims cover that window."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0deepspeed-course-port-{port}")
    except OSError:
        claim.close()
        return False
    _claims.append(claim)
    while len(_claims) > CLAIMS_KEPT:
        _claims.pop(0).close()
    return True


def ephemeral_ports() -> range:
    """The ports the kernel hands out on its own, as the local end of every outgoing connection (Linux's
    ``ip_local_port_range``; 32768–60999 by default)."""
    try:
        low, high = map(int, EPHEMERAL_RANGE.read_text().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A TCP port nobody holds, for one launch (never the same twice in a process). Taken from below the kernel's
    ephemeral range: a port from inside it, free when checked, can become the local end of any connection this
    machine opens in the seconds before a rank binds it (two notebooks side by side once lost a launch to that:
    "EADDRINUSE" in rank 0's TCPStore); below it, a port is only ever taken on purpose. Another process of the
    course never gets the same port in the seconds before its launch binds it (:func:`_claim`)."""
    ephemeral = ephemeral_ports()
    below = range(max(1024, ephemeral.start - 12000), ephemeral.start)
    pick = random.SystemRandom()
    for _ in range(500):
        port = pick.choice(below) if len(below) >= 1000 else 0     # a tiny range left below: the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))            # every address, as a rank's TCPStore binds it
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _handed_out and _claim(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free TCP port found below {ephemeral.start}: is this machine out of ports?")


def deepspeed_cli() -> str:
    """The ``deepspeed`` launcher of this interpreter's environment (the venv's, not a stray one on PATH)."""
    exe = Path(sys.executable).parent / "deepspeed"
    if exe.exists():
        return str(exe)
    found = shutil.which("deepspeed")
    if not found:
        raise FileNotFoundError("The `deepspeed` command is not installed in this environment: run `make setup`.")
    return found


def resolve_script(script: str | Path) -> Path:
    """``script`` as given, else in ``scripts/``, else relative to the repository root."""
    path = Path(script)
    for candidate in (path, paths.SCRIPTS / path, paths.ROOT / path):
        if candidate.is_file():
            return candidate.resolve()
    available = ", ".join(sorted(p.name for p in paths.SCRIPTS.glob("*.py")))
    raise FileNotFoundError(f"Script {script} not found (looked in {paths.relative(paths.SCRIPTS)}/ too). "
                            f"Scripts of the course: {available}")


def new_run_dir(script: Path, name: str | None) -> Path:
    """``build/runs/<time>-<name or script>-<id>/``: one folder per launch, never reused."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = paths.runs_dir() / f"{stamp}-{name or script.stem}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(parents=True)
    return run_dir


def _unchecked_config_path(config: str | Path) -> Path:
    """Where a config file is, without reading it: as given, else in ``configs/`` (as configs.load looks)."""
    path = Path(config)
    return path if path.exists() or not (paths.CONFIGS / path).exists() else paths.CONFIGS / path


def config_args(options: LaunchOptions, run_dir: Path) -> list[str]:
    """``[config_arg, <path>]`` for the script, or nothing without a config.

    With ``precheck`` the config is validated for the launch's world size first (a clear message in the
    cell); without it, it is passed unchanged, so the learner meets DeepSpeed's own error in the ranks.
    A dict is written to the run folder; a file is passed where it is.
    """
    config = options.config
    if config is None:
        return []
    if isinstance(config, dict):
        cfg = configs.validate(config, world_size=options.world_size, trainer=options.trainer) \
            if options.precheck else config
        cfg_path = run_dir / "ds_config.json"
        cfg_path.write_text(json.dumps(cfg, indent=2))
    elif options.precheck:
        configs.validate(config, world_size=options.world_size, trainer=options.trainer)
        cfg_path = Path(configs.load(config)[1])
    else:
        cfg_path = _unchecked_config_path(config)
    return [options.config_arg, paths.relative(cfg_path)]


def write_hostfile(run_dir: Path, hosts: list[str], slots: int) -> Path:
    """``<host> slots=<n>`` lines in the run folder: the nodes DeepSpeed's launcher counts ranks over, in order."""
    hostfile = run_dir / "hostfile"
    hostfile.write_text("".join(f"{host} slots={slots}\n" for host in hosts))
    return hostfile


def node_commands(cli: str, script: Path, script_args: list[str], options: LaunchOptions, port: int,
                  run_dir: Path) -> list[list[str]]:
    """One ``deepspeed`` command per simulated node (one in the usual single-machine case, and over ssh).

    Simulated nodes share a hostfile naming ``node0``, ``node1``, ... and each launcher starts only its
    own node's ranks (``--no_ssh --node_rank n``), all meeting at the same master address and port.
    With ``hosts``, one launcher reads a hostfile of those hosts and starts every node's ranks over ssh
    with pdsh (DeepSpeed's default multi-node path); the first host is the master. With the runner's own
    ``ssh_config``, DeepSpeed's ssh check (plain ``ssh <first host> hostname``, which cannot see that file)
    is left out: :func:`ssh_launch_env` hands the file to pdsh's ssh instead.
    """
    master = options.hosts[0] if options.hosts else "127.0.0.1"
    common = ["--master_addr", master, "--master_port", str(port)]
    tail = ["--enable_each_rank_log", paths.relative(run_folder.ranks_dir(run_dir)), paths.relative(script), *script_args]
    if options.hosts:
        hostfile = write_hostfile(run_dir, list(options.hosts), options.procs)
        check = ["--no_ssh_check"] if options.ssh_config else []
        return [[cli, "--hostfile", paths.relative(hostfile), "--launcher", "pdsh", *check, *common, *tail]]
    if options.nodes == 1:
        return [[cli, "--num_gpus", str(options.procs), *common, *tail]]
    hostfile = write_hostfile(run_dir, [f"node{n}" for n in range(options.nodes)], options.procs)
    return [[cli, "--hostfile", paths.relative(hostfile), "--no_ssh", "--node_rank", str(n), *common, *tail]
            for n in range(options.nodes)]


ENV_FILE = ".deepspeed_env"     # in the run folder; DS_ENV_FILE tells DeepSpeed's runner where it is


def ssh_launch_env(options: LaunchOptions, run_dir: Path, rank_env: dict[str, str]) -> dict[str, str]:
    """The launcher's environment for a launch over ssh (empty otherwise), with the files it names written.

    - ``DS_ENV_FILE``: DeepSpeed's runner exports every ``NAME=value`` line of ``.deepspeed_env`` (looked up in
      the home folder and the current folder, or where this variable says) to the ranks on every host; the
      run folder gets its own, with what the ranks need (:func:`environment.ssh_environment`).
    - ``PDSH_SSH_ARGS_APPEND``: options pdsh adds to each ``ssh`` it runs; here ``-F <ssh_config>``.
    """
    if not options.hosts:
        return {}
    env_file = write_env_file(run_dir / ENV_FILE, ssh_environment(rank_env))
    env = {"DS_ENV_FILE": str(env_file)}
    if options.ssh_config:
        config = str(Path(options.ssh_config).resolve())
        if any(c.isspace() for c in config):
            raise ValueError(f"pdsh splits PDSH_SSH_ARGS_APPEND at blanks: the ssh config's path must have none ({config})")
        env["PDSH_SSH_ARGS_APPEND"] = f"-F {config}"
    return env


def shown_command(commands: list[list[str]], env: dict[str, str] | None = None) -> str:
    """The shell commands a learner could paste into a terminal: ``cd <repo> && deepspeed ...``, one per node,
    after the launcher's own variables (``env``) when it has any."""
    assignments = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return "\n".join(f"cd {shlex.quote(str(paths.ROOT))} && {assignments}" + shlex.join(["deepspeed", *c[1:]])
                     for c in commands)
