"""Human-readable sizes, always in binary units (KiB = 1024 B)."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            return f"{sign}{int(n)} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

