"""Shared by both sides: what the ranks and the notebook kernel (and the course's tooling) import alike.

- :mod:`.paths` — the checkout's folders (standard library only);
- :mod:`.run_folder` — the one module that names a launch's run folder and its entries;
- :mod:`.record` — ``record()`` a figure, :class:`~.record.Record` declarations, reading them back;
- :mod:`.zero_rules` — the ZeRO byte formulas, the offload ladder and its placement table;
- :mod:`.reaper` — which processes belong to a run and ending them (standard library only: the watchdog
  process runs it).

Nothing here imports torch, DeepSpeed or another room of ``course_utils``.
"""
