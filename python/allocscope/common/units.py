"""Human-readable sizes, always in binary units (KiB = 1024 B)."""

from __future__ import annotations

from .errors import InputError

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            return f"{sign}{int(n)} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_PARSE = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(text: str) -> int:
    """'24GiB' -> 25769803776. Binary units (KiB, MiB, GiB, TiB, or K, M, G,
    T), decimal ones (KB, MB, GB, TB), or plain bytes."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _PARSE:
        raise InputError(f"not a size: {text!r} (try 24GiB, 80GB or 1073741824)")
    return int(float(m.group(1)) * _PARSE[unit])
