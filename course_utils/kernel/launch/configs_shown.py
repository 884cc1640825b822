"""The DeepSpeed configs a launch's ranks used, shown under its cell: collapsed, whole, as DeepSpeed read them.

The course's helpers (``ds_config(stage, dtype, ...)``, ``training_arguments(...)``) and the Trainer's "auto" values
build most configs inside the ranks, so the JSON a learner would write is not on the page by itself. The rank hook
keeps every distinct config rank 0's ``DeepSpeedConfig`` read (``configs/<n>.json`` in the run folder, with the batch
sizes and stage DeepSpeed resolved); after the launch, one line names them and, in JupyterLab and the HTML, a
collapsed block holds each whole.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from course_utils.common import paths, run_folder


def read(run_dir: Path) -> list[dict]:
    out = []
    for f in run_folder.config_files(run_dir):
        try:
            out.append({**json.loads(f.read_text()), "path": f})
        except (OSError, ValueError):
            pass
    return out


def summary(entry: dict) -> str:
    """One config in a few words: its ZeRO stage, precision and batch arithmetic, as DeepSpeed resolved them."""
    if entry.get("refused"):
        return f"refused by DeepSpeed ({entry['refused'].splitlines()[0][:120]})"
    r = entry.get("resolved") or {}
    dtype = "bf16" if r.get("bf16") else "fp16" if r.get("fp16") else "fp32"
    batch = (f"train_batch_size {r['train_batch_size']} = {r['micro_batch']} × {r['accumulation']} × "
             f"{r['world_size']:g} ranks" if all(r.get(k) is not None for k in
                                                  ("train_batch_size", "micro_batch", "accumulation", "world_size"))
             else "batch sizes not resolved")
    stage = r.get("zero_stage")
    return f"ZeRO stage {stage if stage is not None else '?'}, {dtype}, {batch}"


def show(run_dir: Path) -> list[dict]:
    """Show the configs of the launch in ``run_dir`` (nothing when its ranks read none); returns them."""
    entries = read(run_dir)
    if not entries:
        return entries
    folder = paths.relative(Path(run_dir) / run_folder.CONFIGS)
    n = len(entries)
    line = (f"DeepSpeed config{'s' if n > 1 else ''} the ranks used: "
            + ("; ".join(f"{i + 1}. {summary(e)}" for i, e in enumerate(entries)) if n <= 2 else f"{n} configs")
            + f" — whole in {folder}/")
    try:
        from IPython import get_ipython
        from IPython.display import display
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None or not hasattr(shell, "kernel"):
        print(line, flush=True)
        return entries
    blocks = "".join(
        f"<p><b>{i + 1}. {html.escape(summary(e))}</b> — <code>{html.escape(paths.relative(e['path']))}</code></p>"
        f"<pre>{html.escape(json.dumps(e['config'], indent=2))}</pre>" for i, e in enumerate(entries))
    display({"text/plain": line,
             "text/html": f"<details><summary>{html.escape(line)}</summary>{blocks}</details>"}, raw=True)
    return entries
