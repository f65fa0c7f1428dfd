"""glibc malloc's ``mallinfo2()`` (glibc 2.33 and later), looked up once: its heaps' own account of the bytes
they hold in use and freed. The ranks read the freed bytes (memdiag.agent.heap); the native marks' build
reads the bytes in use (memdiag.nativemarks.calibrate). None where the C library has no such call."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


@functools.cache
def mallinfo2() -> Any:
    """The C library's ``mallinfo2``, looked up once; None where it has none."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    function.restype = MallInfo2
    function.argtypes = []
    return function
