"""What a script and the notebook kernel both need to know about it: the records it writes (dataclasses deriving
from :class:`course_utils.common.record.Record`), the constants and command lines both sides read. One module per
topic; each imports the standard library and :mod:`course_utils.common` only, so the kernel reads a launch's
records without importing the script (or torch)::

    from course_utils.common.records.offload import Rung
    rungs = read_as(result.records, Rung)
"""
