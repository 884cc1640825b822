"""Around the notebooks: what the make targets, an instructor and the tests run.

- :mod:`.course` — ``make course``: every notebook, the report; :mod:`.manifest` — each notebook's facts
  (``notebooks/manifest.toml``) and the tables made from them; :mod:`.instructors` — INSTRUCTORS.md's table;
- :mod:`.nbtools` — the stored notebooks, their outputs stripped; :mod:`.student` — the student edition;
- :mod:`.workshop` — nbgrader's release and grading, the workshop server; :mod:`.catchup` — a participant's
  notebook run down to a section;
- :mod:`.preflight` — ``make preflight``; :mod:`.config_reference` — the generated config reference.
"""
