"""Giving every allocation a meaning, and live memory over time.

lifetimes: allocation/free pairs. categories: what each allocation is
(category, module, phase, iteration; docs/attribution.md). timeline: live
memory over time, peaks, breakdowns at any moment, iterations, sites.
estimate: the textbook estimate and the waterfall from it to what was
measured. Each works on a loaded Capture and returns plain data; the CUDA
allocator's side comes from allocscope.allocator.
"""

from .categories import CATEGORIES, PHASES, Attribution, attribute, module_label
from .estimate import ConservationError, theory, waterfall
from .lifetimes import Lifetimes, lifetimes, live_bytes
from .timeline import Moment, Timeline, iterations, moment, sites, timeline

__all__ = ["CATEGORIES", "PHASES", "Attribution", "ConservationError", "Lifetimes", "Moment", "Timeline",
           "attribute", "iterations", "lifetimes", "live_bytes", "module_label", "moment", "sites", "theory",
           "timeline", "waterfall"]
