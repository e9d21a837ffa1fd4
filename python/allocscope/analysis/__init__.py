"""Analyses of captures. Each works on a loaded Capture and returns plain data."""

from .lifetimes import Lifetimes, lifetimes, live_bytes

__all__ = ["Lifetimes", "lifetimes", "live_bytes"]
