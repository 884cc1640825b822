"""The settings of one launch, as one immutable value.

``deepspeed(...)`` keeps the keyword arguments notebooks already use; inside the package they travel
as a single frozen :class:`LaunchOptions`, so every step (commands, environment, streaming, failure
messages) reads the same settings and none of them can change a setting behind another's back.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

DEFAULT_TIMEOUT = 600   # seconds; far above any course launch, low enough that a hung cell ends on its own


LAUNCHES_ATTRIBUTE = "course_launch"


def launches(**placement: Any):
    """Mark a function that makes one :func:`course_utils.kernel.launch.deepspeed` launch each time a notebook calls
    it, with this placement (``procs``, ``min_ranks``, ``nodes``, ``env``: the values it passes to ``deepspeed``).
    The README's GPU table and each notebook's "On GPUs" line count a notebook's calls of such a function as its
    launches, as they count its own ``launch.deepspeed(...)`` calls (:mod:`course_utils.tooling.gpu_table`)."""
    unknown = set(placement) - {"procs", "min_ranks", "nodes", "env"}
    if unknown:
        raise TypeError(f"launches() takes procs, min_ranks, nodes and env, not {sorted(unknown)}")

    def mark(func):
        setattr(func, LAUNCHES_ATTRIBUTE, dict(placement))
        return func
    return mark


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch a script; see :func:`course_utils.kernel.launch.deepspeed` for what each field means."""

    procs: int                                    # ranks per node (already resolved from the hardware)
    nodes: int = 1                                # simulated nodes on this machine
    hosts: Sequence[str] | None = None            # hosts reached over ssh by pdsh (DeepSpeed's multi-node path)
    ssh_config: str | Path | None = None          # ssh client config pdsh's ssh reads (-F), for ``hosts``
    config: dict | str | Path | None = None       # DeepSpeed config: a dict, or a path (configs/ looked up)
    trainer: bool = False                         # allow the "auto" values the HF Trainer fills in
    config_arg: str = "--deepspeed_config"        # the script's flag that receives the config path
    timeout: float = DEFAULT_TIMEOUT              # seconds until every process of the launch is killed
    env: Mapping[str, Any] | None = None          # extra environment variables for the ranks
    name: str | None = None                       # run folder name (default: the script's stem)
    check: bool = True                            # raise LaunchError when the launch fails
    verbose: bool = False                         # also stream the lines the learner filter hides
    quiet: bool = False                           # stream nothing but the one-line summary
    precheck: bool = True                         # validate the config with configs.validate first
    on_timeout: str = "stacks"                    # "stacks": dump every rank's Python stacks, then kill; "kill"
    stall: float | None = None                    # seconds of silence (after every rank printed) that count as a hang

    def __post_init__(self) -> None:
        if not isinstance(self.procs, int) or self.procs < 1:
            raise ValueError(f"procs must be a whole number of ranks per node ≥ 1, not {self.procs!r}")
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be a whole number ≥ 1, not {self.nodes!r}")
        if self.hosts is not None:
            if isinstance(self.hosts, str) or not self.hosts or not all(map(_host_name, self.hosts)):
                raise ValueError(f"hosts must be a list of host names or addresses, not {self.hosts!r}")
            if len(set(self.hosts)) != len(self.hosts):
                raise ValueError(f"hosts must name each host once: {list(self.hosts)}")
            if self.nodes != 1:
                raise ValueError("hosts= launches on real hosts over ssh, nodes= simulates nodes here: pass one of them")
            object.__setattr__(self, "hosts", tuple(self.hosts))
        elif self.ssh_config is not None:
            raise ValueError("ssh_config is for a launch over ssh: pass hosts= too")
        if self.on_timeout not in ("stacks", "kill"):
            raise ValueError(f'on_timeout must be "stacks" or "kill", not {self.on_timeout!r}')
        if self.stall is not None and not self.stall > 0:
            raise ValueError(f"stall must be a number of seconds > 0 (or None), not {self.stall!r}")

    @classmethod
    def settings(cls) -> list[str]:
        """The fields a caller sets (``procs`` is resolved from the hardware first)."""
        return [f.name for f in dataclasses.fields(cls) if f.name != "procs"]

    @classmethod
    def signature_of(cls, function: Any) -> inspect.Signature:
        """``function``'s signature with its ``**settings`` spelled out as these fields, defaults and all."""
        sig = inspect.signature(function)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        spelled = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=fields[n].default,
                                     annotation=fields[n].type) for n in cls.settings()]
        kept = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
        return sig.replace(parameters=kept + spelled)

    @property
    def node_count(self) -> int:
        """Nodes of the launch: the hosts reached over ssh, else the simulated nodes."""
        return len(self.hosts) if self.hosts else self.nodes

    @property
    def world_size(self) -> int:
        """Ranks over all nodes (``procs`` on each)."""
        return self.procs * self.node_count


def _host_name(host: Any) -> bool:
    """A name a hostfile line and pdsh's ``-w`` list can carry: no blanks, commas or ``=``."""
    return isinstance(host, str) and bool(host) and not any(c.isspace() or c in ",=" for c in host)
