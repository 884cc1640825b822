"""One live stream out of a launch, and the filter that decides what a learner sees of it.

The launchers' own output comes through pipes; each rank writes its own log file (``--enable_each_rank_log``),
which is followed as it grows. Every line gets a ``[launcher]`` or ``[rank N]`` prefix and goes to the
full log (``launch.log``, ``result.log``) unchanged. What is *printed* in the notebook leaves out the
lines in :data:`CHATTER`, which teach nothing and bury the lines that do, unless ``verbose=True``.
"""
from __future__ import annotations

import queue
import re
import subprocess
import threading
from pathlib import Path

# The lines hidden from the streamed output (never from the logs). One rule per kind of line; each is
# searched in the text after the "[rank N] " / "[launcher] " prefix.
CHATTER: list[re.Pattern[str]] = [
    # DeepSpeed's INFO/DEBUG log lines (accelerator probing, comm backend, config dumps, launcher
    # bookkeeping): dozens per launch, the same every time; its WARNING and ERROR lines stay.
    re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[(INFO|DEBUG)\]"),
    # The launcher's warning that no hostfile exists: every single-machine launch of the course has none
    # on purpose, so the warning is about nothing the learner did or should change.
    re.compile(r"Unable to find hostfile, will proceed with training with local resources only\."),
    # torch's FutureWarnings about renamed or deprecated collectives (torch.distributed.reduce_op,
    # _all_gather_base, ...) that DeepSpeed's comm layer still calls: one per rank, not the learner's
    # code, nothing to act on. Raised in torch/distributed/ or naming a torch.distributed API; the
    # source line Python prints after the warning goes with it (see LearnerFilter).
    re.compile(r"^(\S*/torch/distributed/\S*:\d+: FutureWarning: |\S.*:\d+: FutureWarning: .*torch\.distributed\.)"),
    # DeepSpeed's note, printed by every CPU rank of every launch, that its shared-memory all-reduce op
    # loaded (it says "built" even when the op came from the cache): the same two lines every time.
    re.compile(r"^DeepSpeed deepspeed\.ops\.comm\.deepspeed_shm_comm_op built successfully$"),
    # transformers' notice that the model config has loss_type=None and the default loss is used:
    # printed by every rank of every Trainer launch; the default loss is what the course wants.
    re.compile(r"`loss_type=None` was set in the config but it is unrecognized\."),
    # torch's C++ INFO log lines ("[I1128 18:58:51.479929236 socket.cpp:955] [c10d] The client socket has
    # connected ..."), printed when a launch sets TORCH_CPP_LOG_LEVEL=INFO: its W and E lines stay.
    re.compile(r"^\[I\d{4} [\d:.]+ \S+:\d+\] "),
    # DeepSpeed's warm-up schedulers warn when the engine reads the learning rate before the first step
    # (every engine does, to log it): once per launch and rank, about nothing the learner did.
    re.compile(r"Attempting to get learning rate from scheduler before it has started"),
    # DeepSpeed's warning for a ZeRO run with an optimizer it has not tested (a torch or HF optimizer the
    # course chose on purpose, which notebook 07 compares with DeepSpeed's own).
    re.compile(r"You are using ZeRO with an untested optimizer, proceed with caution"),
    # torch's DataLoader: pin_memory=True (the HF Trainer's default) on a machine without an accelerator.
    # On a CPU there is no device to pin for; on a GPU the warning does not appear. The source line goes too.
    re.compile(r"UserWarning: 'pin_memory' argument is set as true but no accelerator is found"),
    # A tqdm progress bar ("Map: 100%|██████| 1000/1000 [00:00<00:00, ...]") from a library in a rank.
    re.compile(r"\d+%\|[^|]*\|\s*\d+/\d+ \["),
    # The engine's wall-clock timers ("[Rank 0] time (ms) | fwd: … | bwd: …"), three lines a step with
    # "wall_clock_breakdown": notebook 11 reads them from the log where it explains them.
    re.compile(r"^\[Rank \d+\] time \(ms\) \| "),
]
# pdsh's line when the command it ran on a host over ssh failed (that node's launcher ended with an error).
PDSH_NODE_FAILED = re.compile(r"^pdsh@\S+: (\S+): ssh exited with exit code (\d+)$")
# Python's warnings module prints "file:line: Category: message" then the offending source line, indented.
_WARNING_HEADER = re.compile(r"^\S.*:\d+: \w*Warning: ")


class LearnerFilter:
    """Decides, line by line, whether a prefixed line is printed; counts the lines it hides."""

    def __init__(self) -> None:
        self.hidden = 0
        self._echo_due: set[str] = set()     # sources whose next indented line echoes a hidden warning

    def shows(self, line: str) -> bool:
        """True for a line the learner should see; False (and counted) for chatter."""
        source, _, text = line.partition("] ")
        if source in self._echo_due:
            self._echo_due.discard(source)
            if text[:1].isspace() and text.strip():
                self.hidden += 1
                return False
        if any(rule.search(text) for rule in CHATTER):
            if _WARNING_HEADER.match(text):
                self._echo_due.add(source)
            self.hidden += 1
            return False
        return True


class Streams:
    """Collects launcher output (pipes) and rank output (per-rank log files) into one prefixed stream."""

    def __init__(self, launchers: list[subprocess.Popen], ranks_dir: Path, hosts: tuple[str, ...] = ()):
        self.lines: queue.Queue[str] = queue.Queue()
        self.hosts = hosts          # a launch over ssh: pdsh starts each node's line with "<host>: "
        self.failed_hosts: list[str] = []     # hosts whose node launcher failed, as pdsh reported them
        self.ranks_dir = ranks_dir
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, str] = {}
        self.rank_text: dict[int, list[str]] = {}
        self.readers = [threading.Thread(target=self._pump, args=(p, i, len(launchers)), daemon=True)
                        for i, p in enumerate(launchers)]
        for t in self.readers:
            t.start()

    def _pump(self, launcher: subprocess.Popen, node: int, nodes: int) -> None:
        prefix = "[launcher]" if nodes == 1 else f"[launcher node{node}]"
        for line in launcher.stdout:
            failed = PDSH_NODE_FAILED.match(line.rstrip()) if self.hosts else None
            if failed and failed.group(2) != "0":
                self.failed_hosts.append(failed.group(1))
            host, sep, text = line.partition(": ")
            if sep and host in self.hosts:
                self.lines.put(f"[launcher {host}] {text.rstrip()}")
            else:
                self.lines.put(f"{prefix} {line.rstrip()}")

    def poll_rank_logs(self, final: bool = False) -> None:
        """Queue the complete lines the rank logs gained since the last poll (all of them when ``final``)."""
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
        """Every line queued so far, in arrival order."""
        out = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                return out
