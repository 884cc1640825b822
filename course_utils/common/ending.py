"""Ending a process without the interpreter's teardown, losing nothing the teardown would have written.

A rank (``course_utils/rank/hook/sitecustomize.py``) and the course's Jupyter kernel
(``course_utils/kernel/kernel_main.py``) both end with ``os._exit`` from their last exit handler; first they flush
what the teardown would have flushed: every file object still open for writing."""
from __future__ import annotations


def flush_open_files() -> None:
    """Flush every file object still open for writing (the standard streams among them), as the teardown would."""
    import gc
    import io

    gc.unfreeze()         # gc.get_objects() leaves out what gc.freeze() froze (the rank hook freezes torch's import)
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass
