"""The command lines of a launch: which script, which ``deepspeed`` executable, which flags.

Everything here is decided before any process starts, so a bad script name or config fails in the
notebook cell with a clear message instead of inside the ranks, and the learner sees the exact shell
command they could type themselves (``$ cd ... && deepspeed ...``).
"""
from __future__ import annotations

import json
import shlex
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

from .. import configs, paths
from .options import LaunchOptions


def free_port() -> int:
    """A TCP port the kernel just handed out and nobody holds: one per launch, so launches never clash."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def node_commands(cli: str, script: Path, script_args: list[str], options: LaunchOptions, port: int,
                  run_dir: Path) -> list[list[str]]:
    """One ``deepspeed`` command per simulated node (one in the usual single-machine case).

    Simulated nodes share a hostfile naming ``node0``, ``node1``, ... and each launcher starts only its
    own node's ranks (``--no_ssh --node_rank n``), all meeting at the same master address and port.
    """
    common = ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    tail = ["--enable_each_rank_log", paths.relative(run_dir / "ranks"), paths.relative(script), *script_args]
    if options.nodes == 1:
        return [[cli, "--num_gpus", str(options.procs), *common, *tail]]
    hostfile = run_dir / "hostfile"
    hostfile.write_text("".join(f"node{n} slots={options.procs}\n" for n in range(options.nodes)))
    return [[cli, "--hostfile", paths.relative(hostfile), "--no_ssh", "--node_rank", str(n), *common, *tail]
            for n in range(options.nodes)]


def shown_command(commands: list[list[str]]) -> str:
    """The shell commands a learner could paste into a terminal: ``cd <repo> && deepspeed ...``, one per node."""
    return "\n".join(f"cd {shlex.quote(str(paths.ROOT))} && " + shlex.join(["deepspeed", *c[1:]])
                     for c in commands)
