"""The records of notebook 01's launches: who a rank is (:func:`course_utils.rank.distributed.rank_identity`),
every collective once, the collectives a ZeRO step calls, all_reduce timing and the machine's load meanwhile
(scripts/01_collectives.py), the ring all-reduce exercise and its trace (scripts/01_ring.py,
:mod:`course_utils.rank.ring`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import Record

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "barrier")


@dataclass
class Identity(Record, name="identity"):
    """Who a rank is, as the ``deepspeed`` launcher told it, plus what it runs on once joined."""
    node_rank: int
    local_rank: int
    rank: int
    world_size: int
    local_size: int
    master_addr: str | None
    master_port: int
    host: str
    pid: int
    argv: list            # the command-line arguments this rank's script received (sys.argv[1:])
    backend: str | None = None
    device: str | None = None
    ssh_host: str | None = None   # the address ssh reached this rank's node at; None when started without ssh


@dataclass
class CollectiveRow(Record, name="collectives"):
    """One collective on one rank: its tensor before and after, and how it was done."""
    collective: str
    rank: int
    before: list
    after: list
    how: str


@dataclass
class ZeroCollectives(Record, name="zero_collectives"):
    """The collectives one phase of a ZeRO training step called on one rank, as DeepSpeed's comms
    logger saw them (every op that goes through ``deepspeed.comm``)."""
    stage: int
    rank: int
    phase: str            # forward | backward | step
    calls: dict           # op name → number of calls


@dataclass
class AllReduceTime(Record, name="all_reduce_times"):
    """Median seconds of one all_reduce message size."""
    elements: int
    bytes: int
    seconds: float
    gbytes_per_s: float


@dataclass
class TimingLoad(Record, name="timing_load"):
    """What the machine did while this rank timed all_reduce: were the cores its own?"""
    rank: int
    wall_s: float             # seconds the timing took (at least MIN_LOAD_WINDOW_S)
    own_cpu_s: float          # CPU seconds this rank used meanwhile (all its threads)
    machine_busy_s: float     # CPU seconds every process of the machine used meanwhile (psutil.cpu_times)
    cores: int                # logical cores of the machine


@dataclass
class Ring(Record, name="ring"):
    """One rank's ring all-reduce: right or not (the tensor it was given, after the call), and the traffic it sent
    against 2(N−1)/N·S."""
    rank: int
    matches: bool                 # the tensor passed in holds dist.all_reduce's result after the call
    max_abs_diff: float
    bytes_sent: int
    messages: int
    tensor_bytes: int
    expected_bytes: float
    world_size: int
    returned_matches: bool | None = None      # a tensor returned other than the one passed in: does it match? (None: none)
    collectives: dict = field(default_factory=dict)   # collectives the function called (course_utils.rank.ring.record_collectives)


@dataclass
class RingStep(Record, name="ring_step"):
    """One rank after one step of its ring (step 0: before the first send). A chunk's value says whose
    data it holds: rank r started with 2**r in every element."""
    rank: int
    step: int
    sent_chunk: int | None        # which of this rank's chunks it sent in this step (None: not one of them)
    sent_to: int | None
    sent: float | None            # the value it sent
    received_from: int | None
    received: float | None        # the value it received
    held: list                    # every chunk's value after the step

