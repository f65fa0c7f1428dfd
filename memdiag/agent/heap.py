"""glibc malloc's own account of its heaps, read through ``mallinfo2()`` (glibc 2.33 and later): the bytes
freed into its heaps and kept there rather than returned to the system. They are resident (a freed chunk
keeps its pages) and in no tensor's account, so where they grow with the rank count they are a part of
a sparse job's growth that the collectives' buffers do not explain. Elsewhere (another C library, an
older glibc) there is no figure: :func:`free_bytes` returns None.

A call takes each heap's lock in turn and walks its free chunks: a few microseconds with a thousand of them,
18 ms with 39,000 (docs/notes/verdicts.md), hence the tracer's budget for the reads (memdiag.agent.tracer).
"""

from __future__ import annotations

from memdiag.mallinfo import mallinfo2


def free_bytes() -> int | None:
    """The bytes glibc's heaps hold freed and not returned to the system (``fordblks``), every arena
    summed; None where the C library has no ``mallinfo2``."""
    function = mallinfo2()
    if function is None:
        return None
    try:
        return int(function().fordblks)
    except Exception:  # noqa: BLE001 - a figure memdiag can do without, never an error in the job
        return None
