"""Parsing and printing sizes and lists typed by users."""

from __future__ import annotations

import re

from memdiag._errors import UserError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
          "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3, "T": 1024**4, "TB": 1024**4,
          "TIB": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, what: str = "size") -> int:
    """``"512M"`` -> bytes (powers of 1024)."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise UserError(f"{what} {text!r} is not a size; write e.g. 512M, 2G or 1048576")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_rank_list(text: str, what: str = "-n") -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; every entry a positive whole number."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UserError(f"{what} {text!r}: rank counts must be whole numbers >= 1, e.g. 1,2,4")
        values.append(int(part))
    return values


def format_bytes(n: float | None) -> str:
    """Binary units, three significant figures: 1536 -> '1.50 KiB'."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.3g} {unit}" if n < 100 else f"{sign}{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"
