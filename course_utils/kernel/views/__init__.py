"""Notebook side: the tables and figures of each topic, read from the records the ranks wrote.

One module per topic: :mod:`.launcher_devices` (00), :mod:`.distributed` (01), :mod:`.first_loop` (02), :mod:`.zero` (03), :mod:`.offload` (04),
:mod:`.precision` (06), :mod:`.schedules` (07), :mod:`.trainer` (07, 08), :mod:`.translation` (10), :mod:`.perf` (11),
:mod:`.adapters` (12), :mod:`.parallel` (13); :mod:`.source` quotes the installed
libraries' lines and the course's own scripts for all of them. Ranks never import these.
"""
