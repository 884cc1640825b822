"""What the course's loopback sshd (:mod:`.sshd`) needs before it starts: its programs, its keys and its files.

- :func:`find_tool`: ssh, sshd, ssh-keygen and pdsh, on ``PATH`` or in an sbin folder;
- :func:`make_keys`: a host key and a user key, made once with ``ssh-keygen`` under ``build/ssh/keys``;
- :func:`write_configs`: one sshd's ``sshd_config``, ``authorized_keys``, ``known_hosts`` and ``ssh_config``;
- :func:`remove_stale`: the folders of sshds that were killed outright, without their ``stop()``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psutil

SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")       # sshd's folder, often not on a user's PATH


def find_tool(name: str) -> str | None:
    """The absolute path of ``name`` (on ``PATH``, or in an sbin folder), or None."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def remove_stale(root: Path, age: float = 60.0) -> None:
    """Remove the folders of sshds that are gone without their ``stop()`` (their process was killed outright): older
    than ``age`` seconds (a starting sshd may not have written its pid file yet) and no live sshd under their pid."""
    for folder in root.glob("sshd-*"):
        try:
            if time.time() - folder.stat().st_mtime < age:
                continue
            sshd = psutil.Process(int((folder / "sshd.pid").read_text().split()[0]))
            if sshd.name() == "sshd" and sshd.status() != psutil.STATUS_ZOMBIE:
                continue
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
        shutil.rmtree(folder, ignore_errors=True)


def make_keys(folder: Path) -> dict[str, Path]:
    """The host key and the user key (ed25519, no passphrase), made once with ssh-keygen and kept in ``folder``."""
    keys = {"host": folder / "host_ed25519_key", "user": folder / "user_ed25519_key"}
    if all(k.exists() and k.with_suffix(".pub").exists() for k in keys.values()):
        return keys
    folder.parent.mkdir(parents=True, exist_ok=True)
    fresh = folder.parent / f".keys-{uuid.uuid4().hex[:6]}"
    fresh.mkdir(mode=0o700)
    for kind, key in keys.items():
        subprocess.run([find_tool("ssh-keygen") or "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                        f"deepspeed-course {kind} key", "-f", str(fresh / key.name)], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True)
    try:
        fresh.rename(folder)                # whole, or not at all: a second process making keys at once keeps its own
    except OSError:
        shutil.rmtree(fresh, ignore_errors=True)
        if not all(k.exists() for k in keys.values()):
            raise
    return keys


def write_configs(folder: Path, hosts: tuple[str, ...], port: int, user: str, keys: dict[str, Path]) -> None:
    """sshd_config, authorized_keys, known_hosts and ssh_config for one sshd."""
    listen = "".join(f"ListenAddress {h}\n" for h in hosts)
    (folder / "sshd_config").write_text(
        "# The course's own sshd (course_utils/kernel/launch/sshd.py): loopback addresses only, this user, key only.\n"
        f"Port {port}\n{listen}"
        f"HostKey {keys['host']}\n"
        f"PidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
        f"AllowUsers {user}\n"
        "PermitRootLogin prohibit-password\n"     # CI runs as root: key logins only
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "ChallengeResponseAuthentication no\n"
        "UsePAM no\n"                            # PAM needs root and a system service configuration
        "StrictModes no\n"                       # the files live in the build folder, whatever its permissions
        "PermitUserEnvironment no\n"
        "X11Forwarding no\nAllowTcpForwarding no\nAllowAgentForwarding no\nPermitTTY no\n"
        "PrintMotd no\nPrintLastLog no\nUseDNS no\n"
        "LogLevel INFO\n")
    public = keys["user"].with_suffix(".pub").read_text().strip()
    # restrict: no pty or forwarding; from: loopback clients only
    (folder / "authorized_keys").write_text(f'restrict,from="127.0.0.0/8" {public}\n')
    host_public = " ".join(keys["host"].with_suffix(".pub").read_text().split()[:2])
    (folder / "known_hosts").write_text(f"{','.join(f'[{h}]:{port}' for h in hosts)} {host_public}\n")
    (folder / "ssh_config").write_text(
        "# The course's loopback hosts (course_utils/kernel/launch/sshd.py); pdsh's ssh reads this file (-F).\n"
        f"Host {' '.join(hosts)}\n"
        f"  Port {port}\n"
        f"  User {user}\n"
        f"  IdentityFile {keys['user']}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 10\n"
        "  LogLevel ERROR\n")
