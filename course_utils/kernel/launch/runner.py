"""The one runner: every multi-rank launch in the course goes through :func:`deepspeed`.

It runs the real ``deepspeed`` command line launcher as a subprocess in its own process group,
streams each rank's output live with a ``[rank N]`` prefix, and returns the full log and the
figures the script recorded. It checks the config before any rank starts, names the rank that
failed (with its traceback), and on a timeout, an error or a notebook interrupt kills the whole
process group, so no rank outlives the cell that started it.
"""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from course_utils.kernel import hardware, opbuild
from course_utils.common import paths
from course_utils.kernel.launch import commands as cmds
from course_utils.kernel.launch.environment import rank_environment
from course_utils.kernel.launch import configs_shown
from course_utils.kernel.launch.failures import failure_message, finished_message, hidden_note
from course_utils.kernel.launch.options import LaunchOptions
from course_utils.kernel.launch.processes import (end_run_processes, kill_group, kill_ssh_launch, release_build_locks,
    release_shm_buffers, signal_groups, start_launchers, start_watchdog)
from course_utils.kernel.launch.result import LaunchError, LaunchResult
from course_utils.kernel.launch.stacks import rank_stacks
from course_utils.kernel.launch.streams import LearnerFilter, Streams

from course_utils.common.record import read_records
from course_utils.common import run_folder


def deepspeed(script: str | Path, *script_args: Any, procs: int | None = None, min_ranks: int | None = None,
              **settings: Any) -> LaunchResult:
    """Launch ``script`` on ``procs`` ranks (per node) with the real ``deepspeed`` launcher.

    ``settings`` are the fields of :class:`LaunchOptions` (their defaults are there, and ``help(deepspeed)``
    shows them in its signature):

    - ``procs``: ranks per node; default one per GPU, or 2 CPU ranks without a GPU.
    - ``min_ranks``: the ranks the lesson needs; a GPU machine with fewer GPUs (or fewer than ``procs``) runs
      this launch on CPU ranks over gloo and says so in one line (:func:`hardware.placement`).
    - ``config``: a DeepSpeed config (dict, or a path; bare names are looked up in ``configs/``). It is
      validated for the launch's world size first and passed to the script as ``config_arg <path>``.
      ``trainer=True`` allows the "auto" values that the HF Trainer fills (the script hands the path to
      ``TrainingArguments(deepspeed=...)``).
    - ``precheck=False``: skip that validation and pass the config unchanged, to meet DeepSpeed's own error.
    - ``nodes``: simulate several nodes on this machine (one launcher per node, ``--no_ssh``).
    - ``hosts``: DeepSpeed's real multi-node path: a hostfile of these hosts (``procs`` slots each), one launcher
      that starts every node's ranks over ssh with pdsh (``--launcher pdsh``, the first host is the master), and
      ``.deepspeed_env`` with the environment the ranks need. ``ssh_config``: an ssh client config for pdsh's ssh
      (``-F``; :mod:`course_utils.kernel.launch.sshd` makes one for loopback hosts on this machine).
    - ``timeout``: seconds until every process of the launch is killed and :class:`LaunchError` raised.
    - ``on_timeout="stacks"`` (the default): before killing, ask every rank for its Python stacks (the rank
      hook's ``faulthandler``, on SIGUSR1) and put where each rank waited into the error (``result.stacks``, and
      ``stacks/`` in the run folder); ``"kill"`` kills at once.
    - ``stall``: seconds of silence after which a launch counts as hung, like a timeout (stacks, then the kill):
      once every rank has printed a line, no new line from any rank or launcher for this long. For scripts
      that print at least every few seconds; a hang then ends in ``stall`` seconds instead of ``timeout``.
    - ``check``: raise :class:`LaunchError` when a rank fails (else return the result with its returncode).
    - ``verbose``: also stream the launcher/library chatter (DeepSpeed's INFO lines, deprecation warnings;
      they are always in ``result.log``); ``quiet``: stream nothing but the final one-line summary.
    """
    unknown = sorted(set(settings) - set(LaunchOptions.settings()))
    if unknown:
        raise TypeError(f"deepspeed() has no setting {', '.join(map(repr, unknown))}; its settings are procs, "
                        f"min_ranks and {', '.join(LaunchOptions.settings())}")
    hw = hardware.detect()
    place = hardware.placement(hw, procs, min_ranks, _nodes_here(settings))
    if place.cpu_on_gpu_machine:
        settings["env"] = {**(settings.get("env") or {}), **hardware.cpu_ranks_env(place.procs, gpu_machine=True)}
        if not settings.get("quiet"):
            print(place.note, flush=True)
    return run(script, script_args, LaunchOptions(procs=place.procs, **settings))


def _nodes_here(settings: dict) -> int:
    """How many of a launch's nodes are this machine: simulated ``nodes``, or the loopback addresses among ``hosts``
    (their ranks share this machine's GPUs)."""
    import ipaddress

    def loopback(host: str) -> bool:
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host == "localhost"
    hosts = settings.get("hosts")
    if hosts:
        return max(1, sum(map(loopback, hosts)))
    return settings.get("nodes") or 1


deepspeed.__signature__ = LaunchOptions.signature_of(deepspeed)    # help() and the notebook's tooltip list them


def run(script: str | Path, script_args: Sequence[Any], options: LaunchOptions) -> LaunchResult:
    """Launch ``script`` with ``script_args`` as ``options`` say (the core of :func:`deepspeed`)."""
    hardware.detect()     # before the config check imports DeepSpeed: on a CPU machine it sets DS_ACCELERATOR,
    #                       which spares the notebook DeepSpeed's "Setting accelerator to CPU" warning
    script_path = cmds.resolve_script(script)
    opbuild.wait_for_launch(script_path.stem, options.quiet)   # an op it loads still building in the background
    run_dir = cmds.new_run_dir(script_path, options.name)
    # made here, not by DeepSpeed's launcher: with hosts on this machine (loopback), one launcher per host checks
    # whether the folder exists and then makes it (launch.py), and the slower one fails with FileExistsError
    run_folder.ranks_dir(run_dir).mkdir(parents=True, exist_ok=True)
    if options.config is not None and not options.precheck and not options.quiet:
        print("Config pre-check off (precheck=False): the config goes to DeepSpeed unchecked.", flush=True)
    args = [str(a) for a in script_args] + cmds.config_args(options, run_dir)
    port = cmds.free_port()
    commands = cmds.node_commands(cmds.deepspeed_cli(), script_path, args, options, port, run_dir)
    environment = rank_environment(run_dir, options.world_size, options.env)
    launcher_env = cmds.ssh_launch_env(options, run_dir, environment)
    environment.update(launcher_env)
    shown = cmds.shown_command(commands, launcher_env)
    if not options.quiet:
        print(f"$ {shown}", flush=True)

    shown_filter = LearnerFilter()
    log_lines: list[str] = []

    def emit(lines: list[str]) -> None:
        for line in lines:
            log_lines.append(line)                 # the full log keeps every line
            teaches = shown_filter.shows(line)     # asked every time: the filter counts and follows warnings
            if not options.quiet and (teaches or options.verbose):
                print(line, flush=True)

    stacks: dict[int, str] = {}

    def before_kill_on_timeout() -> None:
        if options.on_timeout == "stacks":
            stacks.update(rank_stacks(run_dir))

    started, started_wall = time.monotonic(), time.time()
    launchers: list[subprocess.Popen] = []
    watchdog: subprocess.Popen | None = None
    over_ssh = bool(options.hosts)
    finished: bool | str = False

    def kill(at_once: bool = False) -> None:
        if over_ssh:
            kill_ssh_launch(launchers, run_dir, at_once)
        else:
            _kill_local(launchers, at_once)

    try:
        launchers = start_launchers(commands, paths.ROOT, environment)
        watchdog = start_watchdog(launchers, port, run_dir, over_ssh)
        streams = Streams(launchers, run_folder.ranks_dir(run_dir), options.hosts or ())
        stall = Stall(options.stall, options.world_size) if options.stall else None
        timed_out, finished = _supervise(launchers, streams, emit, started, options.timeout,
                                         lambda: _ranks_done(run_dir, options.world_size),
                                         on_timeout=before_kill_on_timeout, kill=kill, stall=stall)
    except BaseException:
        kill()
        release_build_locks(started_wall)      # a rank killed while it compiled an op would block every later build
        raise
    finally:
        if over_ssh:        # the ranks on every host are sshd's children, not the launcher's
            end_run_processes(run_dir, at_once=bool(finished))     # once the ranks are done, idle launchers go
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        release_shm_buffers(port)

    signal_groups(launchers, signal.SIGKILL)   # anything a rank left behind in the launch's groups goes too
    if timed_out:
        release_build_locks(started_wall)
    seconds = time.monotonic() - started
    codes = [p.returncode for p in launchers]
    returncode = (124 if timed_out else 0 if finished is True else 1 if finished == "failed"
                  else next((c for c in codes if c != 0), 0))
    run_folder.launch_log(run_dir).write_text("\n".join(log_lines) + "\n")
    hidden = 0 if options.verbose else shown_filter.hidden
    result = LaunchResult(returncode=returncode, log="\n".join(log_lines), records=read_records(run_dir),
                          run_dir=run_dir, command=shown, seconds=seconds, world_size=options.world_size,
                          rank_logs={r: "\n".join(lines) for r, lines in streams.rank_text.items()},
                          hidden_lines=hidden, stacks=stacks)
    note = hidden_note(hidden, run_dir)
    if not options.quiet:
        configs_shown.show(run_dir)        # the configs DeepSpeed read in the ranks, collapsed under the cell
    if returncode != 0 and options.check:
        raise LaunchError(failure_message(result, timed_out, options.timeout, note,
                                          stalled=stall.seconds if stall is not None and stall.fired else None), result)
    print(finished_message(result, note), flush=True)       # every launch cell ends with this line, quiet or not
    return result


def _ranks_done(run_dir: Path, world_size: int) -> bool | str:
    """``True`` once every rank has passed ``scaffolding.finish()`` (its mark in ``finished/``), ``"failed"``
    once every rank has either finished or died of a Python exception with at least one such death (the rank
    hook writes ``failures/rank<N>.json`` after printing the traceback), else ``False``."""
    finished, failed = run_folder.finished_ranks(run_dir), run_folder.failed_ranks(run_dir)
    if len(finished) >= world_size:
        return True
    return "failed" if failed and len(finished | failed) >= world_size else False


class Stall:
    """The ``stall=`` rule: the launch is hung once every rank has printed and then nothing came for ``seconds``."""

    def __init__(self, seconds: float, world_size: int):
        self.seconds, self.world_size = seconds, world_size
        self.last_line = time.monotonic()
        self.fired = False

    def expired(self, lines: list[str], streams: Streams) -> bool:
        now = time.monotonic()
        if lines:
            self.last_line = now
        self.fired = len(streams.rank_text) >= self.world_size and now - self.last_line > self.seconds
        return self.fired


def _supervise(launchers: list[subprocess.Popen], streams: Streams, emit: Callable[[list[str]], None],
               started: float, timeout: float, all_finished: Callable[[], bool | str],
               on_timeout: Callable[[], None] = lambda: None,
               kill: Callable[[bool], None] | None = None, stall: Stall | None = None) -> tuple[bool, bool | str]:
    """Stream until every launcher has exited; end the launch early on a failed node or the timeout.

    Returns (whether the timeout ended it, ``all_finished()`` when that ended it: ``True`` when every rank
    finished, ``"failed"`` when every rank finished or died of an exception). A node whose launcher failed
    (a simulated node's launcher exiting with an error, or pdsh reporting a host's failure over ssh) ends the
    others too, since their ranks would wait forever in a collective for the ranks that are gone. Once every
    rank has passed ``scaffolding.finish()`` (its output flushed, its mark in the run folder), or every rank has
    ended and some of them failed, the launch is over: the launchers, idle in DeepSpeed's once-a-second polling
    loop and their own shutdown (2–3 s), are ended at once. On the timeout (or a ``stall``: every rank has
    printed, then silence), ``on_timeout()`` runs before the kill (the runner collects the ranks' stacks there).
    ``kill(at_once)`` ends the launch (default :func:`_kill_local`; ``at_once=True`` once every rank is done).
    """
    kill = kill or (lambda at_once=False: _kill_local(launchers, at_once))
    timed_out = finished = False
    while True:
        streams.poll_rank_logs()
        lines = streams.drain()
        emit(lines)
        codes = [p.poll() for p in launchers]
        if all(c is not None for c in codes):
            break
        done = all_finished()
        if done:
            finished = done
            kill(True)
            break
        if any(c not in (None, 0) for c in codes) or streams.failed_hosts:   # a node failed: its peers would hang
            kill()
            break
        if time.monotonic() - started > timeout or (stall is not None and stall.expired(lines, streams)):
            timed_out = True
            try:
                on_timeout()
            finally:
                kill()
            break
        time.sleep(0.1)
    for t in streams.readers:
        t.join(timeout=5)
    streams.poll_rank_logs(final=True)
    emit(streams.drain())
    return timed_out, finished


def _kill_local(launchers: list[subprocess.Popen], at_once: bool = False) -> None:
    """End a launch on this machine: :func:`kill_group`, or with ``at_once`` (its ranks are done, the launchers
    idle) SIGKILL to the launchers' groups."""
    if not at_once:
        kill_group(launchers)
        return
    signal_groups(launchers, signal.SIGKILL)
    for p in launchers:
        p.wait()
