"""Several hosts on one machine, for DeepSpeed's real multi-node path (a hostfile, pdsh over ssh).

On a cluster, ``deepspeed --hostfile hostfile`` logs into every host listed with ssh (pdsh by default) and starts
that node's ranks there. Here the hosts are loopback addresses (127.0.0.1, 127.0.0.2, ...: on Linux the whole
127/8 reaches this machine) served by an sshd of the course's own, run as the current user:

- on a free port, listening on those addresses only, with a host key and a user key made with ``ssh-keygen``
  under ``build/ssh/``, its own ``sshd_config``, ``authorized_keys`` and ``known_hosts``;
- the ssh client gets its options from this sshd's ``ssh_config`` (``ssh -F``), which the runner hands to pdsh's
  ssh through ``PDSH_SSH_ARGS_APPEND``.

Nothing of the system changes: no ``~/.ssh`` file, no ``/etc`` file, no service. (Run as root, sshd needs its
empty privilege-separation folder, ``/run/sshd`` on Debian, which the ssh service would create at boot; it is
created when sshd reports it missing.) :func:`loopback_hosts` stops the sshd and every process under it when the
block ends, however it ends; so does the end of the Python process, and the death of the one that started it.
"""
from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from course_utils.common import paths, reaper
from course_utils.kernel.launch.commands import free_port
from course_utils.kernel.launch.processes import die_with_parent
from course_utils.kernel.launch.sshd_setup import find_tool, make_keys, remove_stale, write_configs

# The programs, and the Debian/Ubuntu package that has each.
TOOLS = {"pdsh": "pdsh", "ssh": "openssh-client", "ssh-keygen": "openssh-client", "sshd": "openssh-server"}
START_TIMEOUT = 15.0                                   # seconds for sshd to listen and ssh to get in


def loopback_addresses(count: int) -> tuple[str, ...]:
    """``127.0.0.1``, ``127.0.0.2``, ...: ``count`` addresses of this machine, one per "host"."""
    return tuple(f"127.0.0.{i + 1}" for i in range(count))


def why_not(hosts: int | Sequence[str] = 2) -> str | None:
    """None when this machine can serve ``hosts`` over ssh; else what is missing and how to get it."""
    missing = [tool for tool in TOOLS if not find_tool(tool)]
    if missing:
        packages = " ".join(sorted({TOOLS[t] for t in missing}))
        return (f"{', '.join(missing)} not found. Install {'it' if len(missing) == 1 else 'them'} (Debian/Ubuntu: "
                f"sudo apt-get install {packages}; "
                f"`make setup` does it where it runs as root): only the programs are used, the course starts its own "
                f"sshd and needs no ssh service.")
    for host in _addresses(hosts):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
        except OSError as err:
            return (f"{host} is not an address of this machine ({err.strerror}); Linux routes all of 127/8 to the "
                    f"loopback interface, macOS only 127.0.0.1 (add one with: sudo ifconfig lo0 alias {host} up).")
    return None


def _addresses(hosts: int | Sequence[str]) -> tuple[str, ...]:
    return loopback_addresses(hosts) if isinstance(hosts, int) else tuple(hosts)


@dataclass
class LoopbackHosts:
    """A running sshd that makes ``hosts`` reachable over ssh, as the current user, with the files in ``folder``."""

    hosts: tuple[str, ...]
    port: int
    folder: Path                        # sshd_config, ssh_config, authorized_keys, known_hosts, sshd.log
    process: subprocess.Popen
    user: str
    _stopped: bool = field(default=False, repr=False)

    @property
    def ssh_config(self) -> Path:
        """The ssh client's options for these hosts (port, user, key, known hosts): ``ssh -F <this file> <host>``."""
        return self.folder / "ssh_config"

    @property
    def log(self) -> str:
        """What sshd wrote (``-e``: to this folder's ``sshd.log``): listening, each login accepted or refused."""
        try:
            return (self.folder / "sshd.log").read_text(errors="replace")
        except OSError:
            return ""

    def ssh(self, host: str, *command: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        """Run ``command`` on ``host`` as pdsh would (``ssh -F ssh_config host command``)."""
        return subprocess.run([find_tool("ssh") or "ssh", "-F", str(self.ssh_config), host, *command],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    def deepspeed(self, script: str | Path, *script_args: Any, **kwargs: Any):
        """``launch.deepspeed(script, ..., hosts=self.hosts, ssh_config=self.ssh_config)``: ``procs`` ranks on
        each host (default 1), started by DeepSpeed's pdsh launcher over this sshd."""
        from course_utils.kernel.launch.runner import deepspeed

        kwargs.setdefault("procs", 1)
        return deepspeed(script, *script_args, hosts=self.hosts, ssh_config=self.ssh_config, **kwargs)

    def stop(self) -> None:
        """End sshd and every process under it (the sessions, and whatever they still run), remove its folder."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        _end_tree(self.process)
        shutil.rmtree(self.folder, ignore_errors=True)


def start(hosts: int | Sequence[str] = 2, timeout: float = START_TIMEOUT) -> LoopbackHosts:
    """Start an sshd serving ``hosts`` (a count of loopback addresses, or the addresses) on a free port, and check
    that ssh gets into each of them. Raises RuntimeError with the reason (and sshd's log) when it cannot."""
    reason = why_not(hosts)
    if reason:
        raise RuntimeError(reason)
    addresses = _addresses(hosts)
    remove_stale(paths.build_dir() / "ssh")
    keys = make_keys(paths.build_dir() / "ssh" / "keys")
    user = pwd.getpwuid(os.getuid()).pw_name
    for attempt in range(3):            # a port free on 127.0.0.1 may be taken on another address: try another
        port = free_port()
        folder = paths.build_dir() / "ssh" / f"sshd-{port}-{uuid.uuid4().hex[:6]}"
        folder.mkdir(parents=True)
        write_configs(folder, addresses, port, user, keys)
        try:
            cluster = _serve(folder, addresses, port, user, timeout)
        except _PortTaken:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        atexit.register(cluster.stop)
        return cluster
    raise RuntimeError("sshd found no free port on the loopback addresses in 3 tries")


@contextmanager
def loopback_hosts(hosts: int | Sequence[str] = 2, timeout: float = START_TIMEOUT) -> Iterator[LoopbackHosts]:
    """``with loopback_hosts(2) as cluster: cluster.deepspeed(script, ...)``: sshd runs for the block only."""
    cluster = start(hosts, timeout)
    try:
        yield cluster
    finally:
        cluster.stop()


class _PortTaken(Exception):
    pass


def _serve(folder: Path, hosts: tuple[str, ...], port: int, user: str, timeout: float) -> LoopbackHosts:
    """Start sshd (absolute path, ``-D``: stay in front, ``-e``: log to stderr) and wait until ssh gets into
    every host; the privilege-separation folder it may ask for as root is made once. Whatever goes wrong, the
    sshd started here is ended before the error leaves (the caller removes ``folder``)."""
    made_privsep = False
    while True:
        with open(folder / "sshd.log", "ab") as log:
            process = subprocess.Popen([find_tool("sshd"), "-D", "-e", "-f", str(folder / "sshd_config")],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=die_with_parent)
        cluster = LoopbackHosts(hosts=hosts, port=port, folder=folder, process=process, user=user)
        try:
            _wait_until_listening(cluster, timeout)
            _check_logins(cluster, timeout)
            return cluster
        except _SshdExited:
            _end_tree(process)
            log_text = cluster.log
            missing = re.search(r"Missing privilege separation directory: (\S+)", log_text)
            if missing and os.geteuid() == 0 and not made_privsep:
                Path(missing.group(1)).mkdir(mode=0o755, parents=True, exist_ok=True)
                made_privsep = True
                continue
            if "Address already in use" in log_text or "Cannot bind any address" in log_text:
                raise _PortTaken() from None
            raise RuntimeError(f"sshd stopped at start:\n{log_text.strip()}") from None
        except BaseException:
            _end_tree(process)
            raise


class _SshdExited(Exception):
    pass


def _wait_until_listening(cluster: LoopbackHosts, timeout: float) -> None:
    """Until sshd's log says it listens on every host (``Server listening on <host> port <port>.``)."""
    deadline = time.monotonic() + timeout
    while True:
        log = cluster.log
        waiting = [h for h in cluster.hosts if f"Server listening on {h} port {cluster.port}." not in log]
        if not waiting:
            return
        if "Address already in use" in log:     # sshd goes on with the addresses it could bind: not enough
            raise _PortTaken()
        if cluster.process.poll() is not None:
            raise _SshdExited()
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not listen on {', '.join(waiting)} port {cluster.port} within "
                               f"{timeout:.0f} s:\n{log.strip()}")
        time.sleep(0.05)


def _check_logins(cluster: LoopbackHosts, timeout: float) -> None:
    """``ssh host true`` into every host at once, as DeepSpeed's own check would (it cannot see ``ssh -F``)."""
    ssh = find_tool("ssh") or "ssh"
    tries = {h: subprocess.Popen([ssh, "-F", str(cluster.ssh_config), h, "true"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for h in cluster.hosts}
    failed = []
    for host, proc in tries.items():
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{host}: {err.strip() or f'exit code {proc.returncode}'}")
    if failed:
        if cluster.process.poll() is not None:
            raise _SshdExited()
        raise RuntimeError("ssh into the loopback hosts failed:\n" + "\n".join(failed)
                           + f"\nsshd's log:\n{cluster.log.strip()}")


def _end_tree(process: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM ``process`` and every descendant (taken before the first signal), SIGKILL what is left, reap it."""
    tree = reaper.tree(process.pid)
    reaper.end(lambda: [p for p in tree if reaper.alive(p)], grace=grace, rounds=1)
    process.wait()
