"""In the notebook kernel: what a notebook calls between its launches. Ranks never import it.

- :mod:`.launch` — the runner of multi-rank launches (the real ``deepspeed`` launcher) and single tools;
- :mod:`.notebook` — :func:`~.notebook.start`, the notebook's recorded figures, quiet library chatter;
- :mod:`.hardware` — what this machine can run; :mod:`.ops` and :mod:`.opbuild` — DeepSpeed's JIT ops,
  built in the background and waited for; :mod:`.progress` — where a long run is;
- :mod:`.configs`, :mod:`.config_doctor` — configs checked before any rank starts;
- :mod:`.checks` — the exercises' checks; :mod:`.compare` — two series, two state dicts;
- :mod:`.planning` — memory plans and the out-of-memory ladder; :mod:`.checkpoints` — notebook 09's files;
- :mod:`.views` — the tables and plots of each topic, read from the records the ranks wrote.
"""
