"""The caching allocator's settings: parsing a PYTORCH_CUDA_ALLOC_CONF string
the way c10's AcceleratorAllocatorConfig::parseArgs does, and reading the
settings a capture was recorded with.

Only the keys that change the device allocator's decisions are kept; pinned
host memory keys and the like are accepted and ignored, as torch does.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["AllocatorConfig", "ConfigError", "MiB", "parse_alloc_conf", "recorded_config"]

MiB = 1 << 20
SIZE_MAX = (1 << 64) - 1
_INTERVALS = 16  # roundup_power2_divisions buckets: 1 MiB, 2 MiB, ... 32 GiB and above
_LARGE_BUFFER = 20 * MiB

# Keys torch parses that do not change where device blocks go.
_IGNORED = {
    "pinned_use_background_threads", "pinned_use_cuda_host_register", "pinned_num_register_threads",
    "pinned_use_host_register", "pinned_reserve_segment_size_mb", "pinned_max_round_threshold",
    "pinned_free_catch_all", "release_lock_on_cudamalloc", "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom", "backend",
}


class ConfigError(ValueError):
    """An allocator settings string torch would refuse (or this model cannot replay)."""


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """The settings the simulator replays with (defaults: torch's)."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = _LARGE_BUFFER
    large_segment_size: int = _LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS
    expandable_segments: bool = False
    per_process_memory_fraction: float | None = None  # torch >= 2.14 accepts it as a key

    def describe(self) -> str:
        """The settings as a PYTORCH_CUDA_ALLOC_CONF string (only what differs from the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size != SIZE_MAX:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding_size != _LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        if self.large_segment_size != _LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_size // MiB}")
        if self.garbage_collection_threshold > 0:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        table = self.roundup_power2_divisions
        if any(table):
            if len(set(table)) == 1:
                parts.append(f"roundup_power2_divisions:{table[0]}")
            else:
                items = ",".join(f"{1 << i}:{d}" for i, d in enumerate(table))
                parts.append(f"roundup_power2_divisions:[{items}]")
        if self.per_process_memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction:g}")
        return ",".join(parts) or "defaults"


def _tokens(text: str) -> list[str]:
    # torch's ConfigTokenizer: ',', ':', '[' and ']' are tokens; spaces are dropped.
    return [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]


def _int(tok: str, key: str) -> int:
    if not tok.isdigit():
        raise ConfigError(f"{key}: expected a whole number, got {tok!r}")
    return int(tok)


def _float(tok: str, key: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise ConfigError(f"{key}: expected a number, got {tok!r}") from None


def _mib_at_least_20(tok: str, key: str) -> int:
    mb = _int(tok, key)
    if mb < _LARGE_BUFFER // MiB:
        raise ConfigError(f"{key} too small, must be >= {_LARGE_BUFFER // MiB}")
    return mb * MiB


def _bool(tok: str, key: str) -> bool:
    if tok in ("True", "true", "1"):
        return True
    if tok in ("False", "false", "0"):
        return False
    raise ConfigError(f"{key}: expected True or False, got {tok!r}")


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def parse_alloc_conf(text: str, base: AllocatorConfig | None = None) -> AllocatorConfig:
    """Applies a PYTORCH_CUDA_ALLOC_CONF string to `base` (default: torch's
    defaults). As in torch, max_split_size, roundup_power2_divisions and
    garbage_collection_threshold reset to their defaults unless given."""
    base = base or AllocatorConfig()
    fields: dict[str, Any] = dataclasses.asdict(base)
    fields["roundup_power2_divisions"] = [0] * _INTERVALS
    fields["max_split_size"] = SIZE_MAX
    fields["garbage_collection_threshold"] = 0.0
    tok = _tokens(text or "")
    i = 0

    def value(key: str) -> str:
        nonlocal i
        if i + 2 >= len(tok) or tok[i + 1] != ":":
            raise ConfigError(f"{key}: expected '{key}:<value>'")
        i += 2
        return tok[i]

    while i < len(tok):
        key = tok[i]
        if key == "max_split_size_mb":
            fields["max_split_size"] = _mib_at_least_20(value(key), key)
        elif key == "max_non_split_rounding_mb":
            fields["max_non_split_rounding_size"] = _mib_at_least_20(value(key), key)
        elif key == "large_segment_size_mb":
            fields["large_segment_size"] = _int(value(key), key) * MiB
        elif key == "garbage_collection_threshold":
            thr = _float(value(key), key)
            if not 0.0 < thr < 1.0:
                raise ConfigError("garbage_collection_threshold must be in (0.0, 1.0)")
            fields["garbage_collection_threshold"] = thr
        elif key == "expandable_segments":
            fields["expandable_segments"] = _bool(value(key), key)
        elif key == "per_process_memory_fraction":
            frac = _float(value(key), key)
            if not 0.0 <= frac <= 1.0:
                raise ConfigError("per_process_memory_fraction must be in [0, 1]")
            fields["per_process_memory_fraction"] = frac
        elif key == "roundup_power2_divisions":
            i = _parse_divisions(tok, i, fields["roundup_power2_divisions"])
        elif key in _IGNORED:
            value(key)
        else:
            raise ConfigError(f"unknown allocator setting {key!r}")
        i += 1
        if i < len(tok):
            if tok[i] != ",":
                raise ConfigError(f"expected ',' before {tok[i]!r}")
            i += 1
    fields["roundup_power2_divisions"] = tuple(fields["roundup_power2_divisions"])
    return AllocatorConfig(**fields)


def _parse_divisions(tok: list[str], i: int, table: list[int]) -> int:
    """torch's parseRoundUpPower2Divisions; returns the index of the last token used."""
    key = "roundup_power2_divisions"
    if i + 2 >= len(tok) or tok[i + 1] != ":":
        raise ConfigError(f"{key}: expected '{key}:<value>'")
    i += 2
    if tok[i] != "[":
        v = _int(tok[i], key)
        if not _power_of_two(v):
            raise ConfigError(f"{key}: divisions must be a power of 2")
        table[:] = [v] * _INTERVALS
        return i
    first, last_index = True, 0
    i += 1
    while i < len(tok) and tok[i] != "]":
        if i + 2 >= len(tok) or tok[i + 1] != ":":
            raise ConfigError(f"{key}: expected '<MiB>:<divisions>' entries")
        bound, v = tok[i], _int(tok[i + 2], key)
        if v != 0 and not _power_of_two(v):
            raise ConfigError(f"{key}: divisions must be a power of 2 or 0")
        if bound == ">":
            table[last_index + 1:] = [v] * (_INTERVALS - last_index - 1)
        else:
            b = _int(bound, key)
            if not _power_of_two(b):
                raise ConfigError(f"{key}: interval bounds must be powers of 2")
            index = min(b.bit_length() - 1, _INTERVALS - 1)
            if first:
                table[:index] = [v] * index
                first = False
            table[index] = v
            last_index = index
        i += 3
        if i < len(tok) and tok[i] == ",":
            i += 1
    if i >= len(tok):
        raise ConfigError(f"{key}: missing ']'")
    return i


def recorded_config(baseline: dict[str, Any] | None, metadata: dict[str, Any] | None = None) -> AllocatorConfig:
    """The settings a CUDA capture ran with: the baseline's config (what the
    allocator reported), completed from the settings string for the keys the
    snapshot does not report."""
    metadata = metadata or {}
    config = (baseline or {}).get("config") or {}
    raw = config.get("last_allocator_settings") or (metadata.get("alloc_conf") or {}).get("raw") or ""
    try:
        parsed = parse_alloc_conf(raw)
    except ConfigError:
        parsed = AllocatorConfig()
    fields = dataclasses.asdict(parsed)
    if "max_split_size" in config:
        fields["max_split_size"] = int(config["max_split_size"])
    if "garbage_collection_threshold" in config:
        fields["garbage_collection_threshold"] = float(config["garbage_collection_threshold"])
    if "expandable_segments" in config:
        fields["expandable_segments"] = bool(config["expandable_segments"])
    table = config.get("roundup_power2_divisions")
    if table:
        t = [int(x) for x in table][:_INTERVALS]
        fields["roundup_power2_divisions"] = tuple(t + [0] * (_INTERVALS - len(t)))
    else:
        fields["roundup_power2_divisions"] = tuple(fields["roundup_power2_divisions"])
    return AllocatorConfig(**fields)
