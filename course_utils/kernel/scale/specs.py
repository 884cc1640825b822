"""The hardware table (``hardware.toml`` beside this file): GPUs, links and drives with their published figures and
where each figure comes from. Every projection reads it here; a learner adds their own GPU by adding a row."""
from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("hardware.toml")
GB = 1e9


@dataclass(frozen=True)
class Link:
    name: str
    bytes_s: float          # per direction, as one rank sends
    source: str


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_flops: float       # dense bf16 matrix FLOP/s, the vendor's peak
    memory_bytes: float
    memory_bytes_s: float
    host_link: Link
    gpu_link: Link
    source: str


@dataclass(frozen=True)
class Drive:
    name: str
    read_bytes_s: float
    write_bytes_s: float
    source: str


@functools.cache
def _raw() -> dict:
    return tomllib.loads(TABLE.read_text())


def links() -> dict[str, Link]:
    return {name: Link(name, row["gb_s"] * GB, row["source"]) for name, row in _raw()["link"].items()}


def link(name: str) -> Link:
    return _named(links(), name, "link")


def gpus() -> dict[str, Gpu]:
    ls = links()
    out = {}
    for name, row in _raw()["gpu"].items():
        for key in ("host_link", "gpu_link"):
            if row[key] not in ls:
                raise ValueError(f"{TABLE.name}: {name}'s {key} {row[key]!r} is not a [link] of the table: add it or "
                                 f"name one of {sorted(ls)}")
        out[name] = Gpu(name, row["bf16_tflops"] * 1e12, row["memory_gb"] * GB, row["memory_gb_s"] * GB,
                        ls[row["host_link"]], ls[row["gpu_link"]], row["source"])
    return out


def gpu(name: str) -> Gpu:
    return _named(gpus(), name, "GPU")


def named_by(device_name: str) -> Gpu:
    """The table's GPU a device name (``torch.cuda.get_device_name``: "NVIDIA H100 80GB HBM3") names: the row whose
    model (its first word with a digit: "H100", "4090") is a word of it and whose memory, where the name states one ("80GB"), is the row's."""
    import re

    words = set(re.split(r"[\s_-]+", device_name.upper()))
    stated = re.search(r"(\d+)\s*GB", device_name.upper())
    model = {g.name: next(w for w in g.name.upper().split() if any(c.isdigit() for c in w)) for g in gpus().values()}
    found = [g for g in gpus().values() if model[g.name] in words]
    found = [g for g in found if not stated or round(g.memory_bytes / GB) == int(stated.group(1))]
    if len(found) != 1:
        raise ValueError(f"{device_name!r} names {'no' if not found else 'more than one'} GPU of {TABLE.name} "
                         f"({', '.join(gpus())}): add its row, or give the machine's memory_gb")
    return found[0]


def drives() -> dict[str, Drive]:
    return {name: Drive(name, row["read_gb_s"] * GB, row["write_gb_s"] * GB, row["source"])
            for name, row in _raw()["drive"].items()}


def drive(name: str | None = None) -> Drive:
    return _named(drives(), name or next(iter(drives())), "drive")


def network() -> Link:
    """The link between machines the projections assume (one 400 Gb/s port per GPU)."""
    return link("InfiniBand NDR 400 Gb/s")


def _named(table: dict, name: str, what: str):
    if name not in table:
        raise KeyError(f"no {what} named {name!r} in {TABLE.name}; its {what}s: {', '.join(table)}")
    return table[name]


def table():
    """The GPUs as a table for the page: peak, memory, bandwidths, and the source of each row."""
    import pandas as pd

    return pd.DataFrame([{"GPU": g.name, "bf16 dense TFLOP/s": g.bf16_flops / 1e12, "memory GB": g.memory_bytes / GB,
                          "memory GB/s": g.memory_bytes_s / GB, "to host": f"{g.host_link.name} ({g.host_link.bytes_s / GB:g} GB/s)",
                          "GPU to GPU": f"{g.gpu_link.name} ({g.gpu_link.bytes_s / GB:g} GB/s)", "source": g.source}
                         for g in gpus().values()]).set_index("GPU")
