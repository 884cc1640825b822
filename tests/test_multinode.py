"""DeepSpeed's real multi-node path on one machine: a hostfile of two loopback "hosts", the pdsh launcher over an
sshd of the course's own (course_utils.kernel.launch.sshd), .deepspeed_env for the ranks' environment; and nothing left
running afterwards, however the launch ended. The parts first (no launch), then real launches."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from conftest import processes_of
from course_utils.kernel import hardware, launch
from course_utils.kernel.launch import LaunchOptions, commands, environment, sshd, sshd_setup
from course_utils.kernel.launch.processes import end_run_processes
from course_utils.kernel.launch.streams import LearnerFilter, Streams
from course_utils.rank.distributed import rank_identity

SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "report_host.py"
HOSTS = ("127.0.0.1", "127.0.0.2")
CLI = "/venv/bin/deepspeed"
WHY_NOT = sshd.why_not(HOSTS)
needs_ssh = pytest.mark.skipif(WHY_NOT is not None, reason=f"no loopback hosts over ssh here: {WHY_NOT}")


# --- the parts, without a launch ---

def test_options_take_hosts_or_simulated_nodes():
    options = LaunchOptions(procs=2, hosts=list(HOSTS), ssh_config="cfg")
    assert options.hosts == HOSTS and options.world_size == 4 and options.node_count == 2
    for bad in ({"hosts": HOSTS, "nodes": 2}, {"hosts": "127.0.0.1"}, {"hosts": []}, {"hosts": ["a", "a"]},
                {"hosts": ["a b"]}, {"ssh_config": "cfg"}):
        with pytest.raises(ValueError):
            LaunchOptions(procs=1, **bad)


def test_hosts_get_a_hostfile_and_one_pdsh_launcher(tmp_path):
    options = LaunchOptions(procs=1, hosts=HOSTS, ssh_config=tmp_path / "ssh_config")
    [cmd] = commands.node_commands(CLI, SCRIPT, ["--x", "1"], options, 29512, tmp_path)
    assert (tmp_path / "hostfile").read_text() == "127.0.0.1 slots=1\n127.0.0.2 slots=1\n"
    assert cmd[cmd.index("--hostfile") + 1] == commands.paths.relative(tmp_path / "hostfile")
    assert cmd[cmd.index("--launcher") + 1] == "pdsh" and "--no_ssh_check" in cmd
    assert cmd[cmd.index("--master_addr") + 1] == "127.0.0.1" and cmd[cmd.index("--master_port") + 1] == "29512"
    assert not {"--no_ssh", "--node_rank", "--num_gpus"} & set(cmd)
    assert cmd[-3:] == [commands.paths.relative(SCRIPT), "--x", "1"]
    # without the course's ssh config, DeepSpeed's own check (ssh <first host> hostname) stays
    [plain] = commands.node_commands(CLI, SCRIPT, [], LaunchOptions(procs=1, hosts=HOSTS), 29512, tmp_path)
    assert "--no_ssh_check" not in plain


def test_deepspeed_env_carries_what_the_ranks_need_in_the_form_deepspeed_reads(tmp_path, monkeypatch):
    """The file is parsed as DeepSpeed's runner parses it and handed to its PDSHRunner: the remote command line
    exports the run folder and the course's variables; DeepSpeed forwards PYTHON* itself (the rank hook's path)."""
    from deepspeed.launcher.multinode_runner import PDSHRunner
    from deepspeed.launcher.runner import encode_world_info, parse_args

    monkeypatch.setattr(hardware, "detect", lambda: hardware.Hardware(accelerator="cpu", gpus=0))
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.9 5000 10.0.0.1 22")       # the notebook's own ssh session
    options = LaunchOptions(procs=1, hosts=HOSTS, ssh_config=tmp_path / "ssh_config")
    rank_env = environment.rank_environment(tmp_path, options.world_size, {"MY_FLAG": 1})
    assert "SSH_CONNECTION" not in rank_env, "ranks get their SSH_CONNECTION from sshd, not from the notebook"
    env = commands.ssh_launch_env(options, tmp_path, rank_env)
    assert env == {"DS_ENV_FILE": str(tmp_path / ".deepspeed_env"),
                   "PDSH_SSH_ARGS_APPEND": f"-F {(tmp_path / 'ssh_config').resolve()}"}
    lines = dict(line.split("=", 1) for line in Path(env["DS_ENV_FILE"]).read_text().splitlines())
    assert lines["COURSE_RUN_DIR"] == str(tmp_path) and lines["MY_FLAG"] == "1" and lines["DS_ACCELERATOR"] == "cpu"
    assert lines["PATH"] == os.environ["PATH"]
    assert not [k for k in lines if k.startswith("PYTHON")], "DeepSpeed exports PYTHON* by itself"

    args = parse_args(["--hostfile", "hostfile", "--launcher", "pdsh", "--master_addr", "127.0.0.1", "x.py", "--y"])
    runner = PDSHRunner(args, encode_world_info({h: [0] for h in HOSTS}))
    for key, value in lines.items():
        runner.add_export(key, value)
    cmd, _, pdsh_env = runner.get_cmd(dict(rank_env), {h: [0] for h in HOSTS})
    assert cmd[:6] == ["pdsh", "-S", "-f", "1024", "-w", "127.0.0.1,127.0.0.2"] and pdsh_env["PDSH_RCMD_TYPE"] == "ssh"
    assert f"export COURSE_RUN_DIR={tmp_path};" in cmd[6] and "--node_rank=%n" in cmd

    with pytest.raises(ValueError, match="cannot reach ranks over ssh"):
        environment.ssh_environment({**rank_env, "MY_FLAG": 'say "hi"'})


def test_shown_command_sets_the_launchers_variables():
    shown = commands.shown_command([[CLI, "--hostfile", "h", "s.py"]], {"DS_ENV_FILE": "/r/.deepspeed_env",
                                                                       "PDSH_SSH_ARGS_APPEND": "-F /b/ssh_config"})
    assert shown == (f"cd {commands.paths.ROOT} && DS_ENV_FILE=/r/.deepspeed_env "
                     "PDSH_SSH_ARGS_APPEND='-F /b/ssh_config' deepspeed --hostfile h s.py")


def test_pdsh_lines_are_named_by_host_and_a_failed_host_is_noticed(tmp_path):
    out = io.StringIO("127.0.0.2: [2025-01-02 10:11:12,345] [INFO] [launch.py:152:main] WORLD INFO DICT: {}\n"
                      "127.0.0.1: something the learner should read\n"
                      "pdsh@vm: 127.0.0.2: ssh exited with exit code 1\n")
    streams = Streams([SimpleNamespace(stdout=out)], tmp_path / "ranks", HOSTS)
    for t in streams.readers:
        t.join()
    lines = streams.drain()
    assert lines[0].startswith("[launcher 127.0.0.2] [2025") and lines[1] == "[launcher 127.0.0.1] something the learner should read"
    assert [LearnerFilter().shows(line) for line in lines] == [False, True, True]
    assert streams.failed_hosts == ["127.0.0.2"]


def test_sshd_files(tmp_path):
    keys = {"host": tmp_path / "host_ed25519_key", "user": tmp_path / "user_ed25519_key"}
    for kind, key in keys.items():
        key.with_suffix(".pub").write_text(f"ssh-ed25519 AAAA{kind} deepspeed-course {kind} key\n")
    sshd_setup.write_configs(tmp_path, HOSTS, 2222, "learner", keys)
    config = (tmp_path / "sshd_config").read_text().splitlines()
    for line in ("Port 2222", "ListenAddress 127.0.0.1", "ListenAddress 127.0.0.2", "UsePAM no", "StrictModes no",
                 f"PidFile {tmp_path / 'sshd.pid'}", f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}",
                 "PermitRootLogin prohibit-password", "PasswordAuthentication no", "AllowUsers learner"):
        assert line in config
    assert (tmp_path / "authorized_keys").read_text() == 'restrict,from="127.0.0.0/8" ssh-ed25519 AAAAuser deepspeed-course user key\n'
    assert (tmp_path / "known_hosts").read_text() == "[127.0.0.1]:2222,[127.0.0.2]:2222 ssh-ed25519 AAAAhost\n"
    client = (tmp_path / "ssh_config").read_text()
    assert "Host 127.0.0.1 127.0.0.2\n" in client and "  Port 2222\n" in client and "  StrictHostKeyChecking yes\n" in client


def test_folders_of_sshds_killed_outright_are_removed_later(tmp_path):
    stale, starting = tmp_path / "sshd-1-aaaaaa", tmp_path / "sshd-2-bbbbbb"
    for folder in (stale, starting):
        folder.mkdir()
    (stale / "sshd.pid").write_text("999999999\n")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    sshd_setup.remove_stale(tmp_path)
    assert not stale.exists() and starting.exists(), "a folder whose sshd may still be starting stays"


def test_missing_tools_are_named_with_their_packages(monkeypatch):
    monkeypatch.setattr(sshd, "find_tool", lambda name: None if name in ("pdsh", "sshd") else f"/usr/bin/{name}")
    reason = sshd.why_not()
    assert reason.startswith("pdsh, sshd not found") and "apt-get install openssh-server pdsh" in reason


def test_a_rank_tells_its_host_from_sshs_connection(monkeypatch):
    monkeypatch.setenv("SSH_CONNECTION", "127.0.0.1 40000 127.0.0.2 2222")
    assert rank_identity().ssh_host == "127.0.0.2"
    monkeypatch.delenv("SSH_CONNECTION")
    assert rank_identity().ssh_host is None


def test_processes_of_a_run_are_found_by_environment_or_command_line(tmp_path):
    by_env = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, "COURSE_RUN_DIR": str(tmp_path)})
    by_line = subprocess.Popen(["sh", "-c", f"export COURSE_RUN_DIR={tmp_path}; sleep 60; true"])
    time.sleep(0.2)
    end_run_processes(tmp_path)
    assert by_env.wait(timeout=5) is not None and by_line.wait(timeout=5) is not None


# --- real launches over the loopback sshd ---

def _sshd_tree(cluster: sshd.LoopbackHosts) -> list[psutil.Process]:
    root = psutil.Process(cluster.process.pid)
    return [root, *root.children(recursive=True)]


def _alive(procs: list[psutil.Process], wait: float = 0.0) -> list[psutil.Process]:
    """Those of ``procs`` still running (zombies count as gone) after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def _launch_leaves_nothing(run: callable) -> tuple[object, Path]:
    """Start the sshd, ``run(cluster)``, stop it: returns what ``run`` returned or raised, and the run folder.
    Asserts that no process of the launch (pdsh, ssh, launchers, ranks) is left, none under sshd once the launch
    has returned (within 5 s: sshd ends a session once its command has ended), and none of sshd's after it stopped."""
    before = set(launch.paths.runs_dir().glob("*")) if launch.paths.runs_dir().exists() else set()
    seen: list[psutil.Process] = []
    with sshd.loopback_hosts(HOSTS) as cluster:
        try:
            outcome = run(cluster)
        except launch.LaunchError as err:
            outcome = err
        [run_dir] = set(launch.paths.runs_dir().glob("*")) - before
        assert not processes_of(run_dir), f"processes of the launch outlived it: {processes_of(run_dir)}"
        seen = _sshd_tree(cluster)
        assert not _alive(seen[1:], wait=5), f"sessions or ranks still under sshd: {_alive(seen[1:])}"
    assert not _alive(seen), f"sshd outlived its block: {_alive(seen)}"
    assert not (launch.paths.build_dir() / "ssh" / cluster.folder.name).exists()
    return outcome, run_dir


@needs_ssh
def test_two_hosts_over_ssh_with_pdsh(capsys):
    """2 hosts × 1 rank of notebook 01's launch: each rank was started on its own host (ssh reached 127.0.0.1 and
    127.0.0.2), the all_reduce sums over both, the printed command is the real one, notebook 01's table reads the
    run, and nothing is left running afterwards."""
    from course_utils.kernel.views import distributed as D

    result, run_dir = _launch_leaves_nothing(lambda c: c.deepspeed("01_collectives.py", "--cpu", procs=1, timeout=120))
    assert result.returncode == 0
    by_rank = {r["rank"]: r["value"] for r in result.records if r["name"] == "identity"}
    assert {r: i["ssh_host"] for r, i in by_rank.items()} == {0: "127.0.0.1", 1: "127.0.0.2"}
    assert [(i["node_rank"], i["world_size"], i["master_addr"]) for _, i in sorted(by_rank.items())] == \
        [(0, 2, "127.0.0.1"), (1, 2, "127.0.0.1")]
    out = capsys.readouterr().out
    assert "PDSH_SSH_ARGS_APPEND=" in out and "deepspeed --hostfile " in out and "--launcher pdsh" in out
    assert "[INFO]" not in out
    assert (run_dir / "hostfile").read_text() == "127.0.0.1 slots=1\n127.0.0.2 slots=1\n"
    table = D.ssh_launch_table(result)
    assert table["ssh_host"].tolist() == ["127.0.0.1", "127.0.0.2"]
    summed = [sum(column) for column in zip(*table["all_reduce before"])]
    assert all(after == summed for after in table["all_reduce after"])


@needs_ssh
@pytest.mark.extended      # pdsh's report of a failed host; the success test covers what a launch over ssh leaves
def test_a_failed_host_ends_the_launch_and_leaves_nothing():
    """Rank 1 raises while rank 0 waits outside any collective (it would never notice): pdsh's report that host
    127.0.0.2 failed ends the launch long before its timeout, the error names rank 1."""
    err, _ = _launch_leaves_nothing(lambda c: c.deepspeed(SCRIPT, "--fail_rank", 1, timeout=120, quiet=True))
    assert isinstance(err, launch.LaunchError), "the launch should have failed"
    assert str(err).startswith("Rank 1 failed") and "deliberate failure on rank 1" in str(err)
    assert err.result.seconds < 60


@needs_ssh
@pytest.mark.extended      # the failed-host test covers the same kill path over ssh, the runner's tests the timeout
def test_a_timeout_while_the_hosts_start_leaves_nothing():
    """A launch over ssh killed at its timeout, while pdsh, ssh and the nodes' launchers are still starting."""
    err, _ = _launch_leaves_nothing(lambda c: c.deepspeed(SCRIPT, "--hang", timeout=8, quiet=True))
    assert isinstance(err, launch.LaunchError) and "timed out after 8 s" in str(err)
