"""Analyses of captures. Each works on a loaded Capture and returns plain data.

lifetimes: allocation/free pairs. attribution: what each allocation is
(category, module, phase). memory: live memory over time, peaks, iterations,
sites. theory: the textbook estimate and the waterfall to what was measured.
report: all of it as one versioned JSON document.
"""

from .attribution import CATEGORIES, PHASES, Attribution, attribute
from .lifetimes import Lifetimes, lifetimes, live_bytes
from .memory import Moment, Timeline, iterations, moment, sites, timeline
from .report import SCHEMA, build_report
from .theory import ConservationError, theory, waterfall

__all__ = ["CATEGORIES", "PHASES", "SCHEMA", "Attribution", "ConservationError", "Lifetimes", "Moment", "Timeline",
           "attribute", "build_report", "iterations", "lifetimes", "live_bytes", "moment", "sites", "theory",
           "timeline", "waterfall"]
