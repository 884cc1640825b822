"""Turning a failed launch into one message that names what went wrong.

When one rank dies, its peers die soon after with connection errors that say nothing about the cause.
The rank hook (``course_utils/rank/hook/sitecustomize.py``) writes ``failures/rank<N>.json`` with the
time of each uncaught exception, so the message can name the rank that failed *first* and show its
traceback, not the last rank to notice.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

from course_utils.common import paths
from course_utils.common import run_folder
from course_utils.kernel.launch.result import LaunchResult
from course_utils.kernel.launch.stacks import main_thread_stack

TAIL_LINES = 25


def tail(text: str, n: int = TAIL_LINES) -> str:
    """The last ``n`` lines of ``text``."""
    return "\n".join(text.rstrip().splitlines()[-n:])


def first_failure(run_dir: Path, rank_logs: dict[int, str]) -> tuple[int | None, str]:
    """The rank that died first and its traceback: from the rank hook's records, else from the logs."""
    records = []
    for path in run_folder.failure_files(run_dir):
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


# DeepSpeed's local launcher (deepspeed/launcher/launch.py, sigkill_handler) logs the status of the first rank it
# finds ended with a non-zero status: "[... '--local_rank=1', ...] exits with return code = -9". Negative: killed by a
# signal. The command in that line is not that rank's: it is ``cmd``, the variable its spawn loop left behind, so it
# always shows the last rank the launcher started (:func:`oom_killed_ranks` and :func:`unaccounted_ranks`
# find the rank another way).
_EXITED = re.compile(r"exits with return code = (-?\d+)")
LESS_MEMORY = ("What to change: less memory per rank — a smaller micro-batch with gradient accumulation, a higher ZeRO "
               "stage, offload, fewer ranks on this machine (notebook 05's OOM ladder)")
SIGNAL_CAUSES = {
    9: ("SIGKILL", "with no traceback this is most often the kernel's out-of-memory killer: the machine, container or "
        "cgroup ran out of memory (`dmesg | grep -i oom`, or the container's memory events, say which). " + LESS_MEMORY),
    6: ("SIGABRT", "native code aborted (a C++ exception or assertion in torch, gloo/NCCL or a compiled op); the "
        "lines just above it in the rank's log usually say which"),
    11: ("SIGSEGV", "a crash in native code (a compiled op built for another version, or a bug in an extension)"),
    7: ("SIGBUS", "often /dev/shm full: DeepSpeed's CPU all-reduce and the DataLoader's workers keep buffers there"),
}


def _exits(log: str) -> Iterator[tuple[int, str]]:
    """(return code, node) of each "exits with return code" line, in order. ``node`` is "" for a single-machine
    launch, else the host whose launcher saw it. No rank: the line does not say which (see above)."""
    for line in log.splitlines():
        m = _EXITED.search(line)
        if m:
            yield int(m[1]), line.partition("] ")[0].lstrip("[").removeprefix("launcher").strip()


def launcher_exit(log: str) -> tuple[int, str] | None:
    """(return code, node) of the first rank DeepSpeed's launcher saw end with a non-zero status, or None."""
    return next(_exits(log), None)


def killed_signal(log: str) -> tuple[int, str] | None:
    """(signal number, node) of the first rank a launcher saw killed by a signal (a negative return code), or None."""
    return next(((-code, node) for code, node in _exits(log) if code < 0), None)


def unaccounted_ranks(result: LaunchResult) -> list[int]:
    """The ranks that left neither a finish mark nor a record of a Python exception: the ones a signal ended (the
    rank hook records every exception, a peer's lost connection included, before that rank exits)."""
    return sorted(set(range(result.world_size)) - run_folder.failed_ranks(result.run_dir)
                  - run_folder.finished_ranks(result.run_dir))


def oom_killed_ranks(result: LaunchResult) -> list[int]:
    """The ranks whose memory cgroup (:func:`course_utils.common.run_folder.join_memory_cgroup`) counted an
    out-of-memory kill."""
    from course_utils.kernel.launch.memcap import oom_kills

    return sorted(r for r, group in run_folder.memory_cgroups(result.run_dir).items() if oom_kills(group) > 0)


def killed_message(ranks: list[int], signum: int, node: str = "", counted: bool = False) -> str:
    """Why a rank (one of ``ranks``, when more than one could be it) ended by signal ``signum`` without a traceback,
    and what to change."""
    name, cause = SIGNAL_CAUSES.get(signum, (f"signal {signum}", "something outside Python ended it"))
    where = f" on {node}'s launcher" if node else ""
    who = (f"Rank {ranks[0]}" if len(ranks) == 1 else f"One of ranks {', '.join(map(str, ranks))}" if ranks
           else "A rank")
    which = ("" if len(ranks) == 1 else " DeepSpeed's launcher reports the status, not which rank had it; the ranks "
             "that left no record were ended by a signal, that one or the launcher's own.")
    if counted:      # the rank's memory cgroup counted the kill: no guessing, and no doubt which rank
        cause, which = f"the kernel's out-of-memory killer, which its memory cgroup counted. {LESS_MEMORY}", ""
    return (f"{who}{where} was killed by {name} (exit status -{signum}) and left no Python traceback: {cause}.{which} "
            "Peers that fail afterwards with connection errors only lost it.")


def hidden_note(hidden: int, run_dir: Path) -> str:
    """Where the lines the learner filter kept out of the cell's output are, or "" when none were."""
    if not hidden:
        return ""
    return (f"({hidden} line{'s' if hidden != 1 else ''} of launcher/library chatter hidden: "
            f"{paths.relative(run_folder.launch_log(run_dir))}, or verbose=True)")


def finished_message(result: LaunchResult, note: str = "") -> str:
    """The last line of a launch that raised nothing: ✔ when it succeeded. A launch that failed and was returned
    anyway (``check=False``) says so, with its exit code and how many ranks got to the end, never ✔."""
    ranks = f"{result.world_size} rank{'s' if result.world_size != 1 else ''}"
    logs = f"logs: {paths.relative(result.run_dir)}/"
    if result.returncode == 0:
        line = f"✔ {ranks} finished in {result.seconds:.1f} s — {logs}"
    else:
        done = len(run_folder.finished_ranks(result.run_dir))
        line = (f"✘ the launch failed with exit code {result.returncode} after {result.seconds:.1f} s "
                f"({done} of {ranks} finished) — {logs}")
    return f"{line} {note}" if note else line


_BATCH = re.compile(r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* world_size "
                    r"(\d+) != (\d+) \* (\d+) \* (\d+)")


# A learner's exercise function runs in the ranks from the file checks.export_function wrote under build/exercises/:
# a name the notebook imported is not defined there.
_EXERCISE_FRAME = re.compile(r'File "[^"]*/exercises/[^"]*\.py", line \d+')
_UNDEFINED = re.compile(r"NameError: name '(\w+)' is not defined")


def diagnosis(trace: str) -> str:
    """What to change, for failures whose own message does not say it; "" when none applies.

    DeepSpeed's batch assertion already names its numbers (notebook 02 has you read it); what it cannot say is
    that on CPU-only ranks the Trainer counted one rank. A NameError in a learner's exported function cannot say that
    the notebook's imports stay in the notebook.
    """
    undefined = _UNDEFINED.search(trace)
    if undefined and _EXERCISE_FRAME.search(trace):
        return (f"What to change: your function ran in the ranks from the file the notebook wrote for them, which holds "
                f"it after `import torch` and `import torch.distributed as dist` and nothing else of the notebook, "
                f"neither its imports nor the other functions you defined there: import what `{undefined.group(1)}` "
                f"names inside your function, or define it there if it is a helper of yours.")
    batch = _BATCH.search(trace)
    if batch:
        train, micro, accumulation, world = map(int, batch.groups())
        if world > 1 and train == micro * accumulation and ("transformers" in trace or "accelerate" in trace):
            return ("What to change: the Trainer computed train_batch_size for ONE rank while DeepSpeed sees "
                    f"{world}. On CPU-only ranks TrainingArguments does not set up the distributed state DeepSpeed "
                    "uses (accelerate looks for an accelerator), so every rank counts itself alone. Create "
                    "accelerate's PartialState for DeepSpeed over gloo before TrainingArguments and pass "
                    "accelerator_config={'use_configured_state': True} (notebook 08, section 8); the course's rank "
                    "hook does this for you unless the launch sets COURSE_HOOK_TRAINER=0.")
    return ""


def failure_message(result: LaunchResult, timed_out: bool, timeout: float, note: str = "",
                    stalled: float | None = None) -> str:
    """The :class:`LaunchError` message: a timeout, or a stall of ``stalled`` seconds (every rank's stack, or its
    last lines), or the first failing rank."""
    where = (f"Logs: {paths.relative(run_folder.launch_log(result.run_dir))} and "
             f"{run_folder.RANKS}/.") + (f" {note}" if note else "")
    if timed_out:
        ended = (f"Launch stalled: every rank had printed, then no line came for {stalled:g} s (stall={stalled:g})"
                 if stalled else f"Launch timed out after {timeout:.0f} s")
        knob = "stall" if stalled else "timeout"
        if result.stacks:
            where_each = "\n".join(f"--- rank {r}: where it was (most recent call first) ---\n{main_thread_stack(t)}"
                                   for r, t in sorted(result.stacks.items()))
            missing = sorted(set(range(result.world_size)) - set(result.stacks))
            return (f"{ended}; every rank's Python stack was taken, then every "
                    f"process of the launch was killed. Compare the ranks: one waiting in a collective (all_reduce, "
                    f"barrier, ...) that another never reached is a hang; all of them busy in training code is a run "
                    f"that needs a longer {knob}=.\n{where_each}\n"
                    + (f"(no stack from rank(s) {missing}: not started yet, or already gone)\n" if missing else "")
                    + f"All threads: {paths.relative(result.run_dir)}/stacks/. {where}")
        tails = "\n".join(f"--- rank {r} (last lines) ---\n{tail(t, 8)}" for r, t in sorted(result.rank_logs.items()))
        return (f"{ended} and every process of it was killed. A rank stuck "
                f"in a collective (all_reduce, barrier, ...) that another rank never reached looks like "
                f"this; so does a run that needs a longer {knob}=.\n{tails}\n{where}")
    killed = killed_signal(result.log)
    if killed:
        signum, node = killed
        oom = oom_killed_ranks(result) if signum == 9 else []
        ranks = oom or unaccounted_ranks(result)
        lines = "".join(f"--- rank {r} (last lines) ---\n{tail(result.rank_logs.get(r, ''), 8)}\n" for r in ranks)
        return f"{killed_message(ranks, signum, node, counted=bool(oom))}\n{lines}{where}"
    rank, trace = first_failure(result.run_dir, result.rank_logs)
    if rank is None:
        return (f"Launch failed (exit code {result.returncode}) without a Python traceback (a rank exited "
                f"with an error status or was killed); the end of the log:\n{tail(result.log)}\n{where}")
    lost = re.search(r"Connection (closed|reset) by peer", trace)
    vanished = unaccounted_ranks(result) if lost else []
    if vanished:      # the launcher logged a peer's status (an older hook, or a peer it found first): the rank that
        #               vanished left no record at all
        which = f"Rank {vanished[0]}" if len(vanished) == 1 else f"One of ranks {', '.join(map(str, vanished))}"
        return (f"{which} ended without a Python traceback (killed by a signal; "
                f"{SIGNAL_CAUSES[9][1]}). Rank {rank} only lost its connection to it:\n{tail(trace, 4)}\n{where}")
    advice = diagnosis(trace)
    return (f"Rank {rank} failed (launch exit code {result.returncode}):\n{tail(trace)}\n"
            + (f"{advice}\n" if advice else "") + where)
