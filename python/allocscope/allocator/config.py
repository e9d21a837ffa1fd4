"""The caching allocator's settings: parsing a PYTORCH_CUDA_ALLOC_CONF string
the way c10's AcceleratorAllocatorConfig::parseArgs does (its tokenizer, its
keys, its checks), and reading the settings a capture was recorded with.

One tokenizer and one item splitter serve both the strict parse the model
replays with (parse_alloc_conf) and the lenient record a capture's metadata
keeps of whatever the user set (settings_items). Only the keys that change
the device allocator's decisions are kept; pinned host memory keys and the
like are accepted and ignored, as torch does.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..common.errors import InputError
from .sizes import LARGE_BUFFER, ROUNDUP_INTERVALS, SIZE_MAX, MiB

__all__ = ["AllocatorConfig", "ConfigError", "divisions_list", "parse_alloc_conf", "recorded_config", "settings_items"]

# Keys torch parses that do not change where device blocks go.
_IGNORED = {
    "pinned_use_background_threads", "pinned_use_cuda_host_register", "pinned_num_register_threads",
    "pinned_use_host_register", "pinned_reserve_segment_size_mb", "pinned_max_round_threshold",
    "pinned_free_catch_all", "release_lock_on_cudamalloc", "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom", "backend",
}


class ConfigError(InputError):
    """An allocator settings string torch would refuse (or this model cannot replay)."""


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """The settings the model replays with (defaults: torch's)."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = LARGE_BUFFER
    large_segment_size: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    expandable_segments: bool = False
    per_process_memory_fraction: float | None = None  # torch >= 2.14 accepts it as a key

    def describe(self) -> str:
        """The settings as a PYTORCH_CUDA_ALLOC_CONF string (only what differs from the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size != SIZE_MAX:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding_size != LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        if self.large_segment_size != LARGE_BUFFER:
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
    return [t for t in re.split(r"([,:\[\]])", (text or "").replace(" ", "")) if t]


def _items(text: str, *, strict: bool) -> list[tuple[str, list[str]]]:
    """(key, value tokens) of each comma-separated setting; a bracketed list
    stays one value. strict: refuse what torch refuses to read as a setting."""
    tok = _tokens(text)
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(tok):
        key = tok[i]
        i += 1
        if key in ",:[]":
            if strict:
                raise ConfigError(f"expected a setting name, got {key!r}")
            continue
        value: list[str] = []
        if i < len(tok) and tok[i] == ":":
            i += 1
            depth = 0
            while i < len(tok) and (depth or tok[i] != ","):
                depth += (tok[i] == "[") - (tok[i] == "]")
                value.append(tok[i])
                i += 1
        if strict and not value:
            raise ConfigError(f"{key}: expected '{key}:<value>'")
        out.append((key, value))
        i += 1  # the ',' after the value
    return out


def settings_items(text: str | None) -> dict[str, str]:
    """A settings string as {key: value text}, without judging keys or values
    (what a capture's metadata records of PYTORCH_CUDA_ALLOC_CONF)."""
    return {key: "".join(value) for key, value in _items(text or "", strict=False)}


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
    if mb < LARGE_BUFFER // MiB:
        raise ConfigError(f"{key} too small, must be >= {LARGE_BUFFER // MiB}")
    return mb * MiB


def _bool(tok: str, key: str) -> bool:
    if tok in ("True", "true", "1"):
        return True
    if tok in ("False", "false", "0"):
        return False
    raise ConfigError(f"{key}: expected True or False, got {tok!r}")


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _scalar(key: str, value: list[str]) -> str:
    if len(value) != 1:
        raise ConfigError(f"{key}: expected one value, got {''.join(value)!r}")
    return value[0]


def parse_alloc_conf(text: str, base: AllocatorConfig | None = None) -> AllocatorConfig:
    """Applies a PYTORCH_CUDA_ALLOC_CONF string to `base` (default: torch's
    defaults). As in torch, max_split_size, roundup_power2_divisions and
    garbage_collection_threshold reset to their defaults unless given."""
    base = base or AllocatorConfig()
    fields: dict[str, Any] = dataclasses.asdict(base)
    fields["roundup_power2_divisions"] = [0] * ROUNDUP_INTERVALS
    fields["max_split_size"] = SIZE_MAX
    fields["garbage_collection_threshold"] = 0.0
    for key, value in _items(text or "", strict=True):
        if key == "roundup_power2_divisions":
            _parse_divisions(value, fields["roundup_power2_divisions"])
        elif key in _IGNORED:
            pass
        elif key == "max_split_size_mb":
            fields["max_split_size"] = _mib_at_least_20(_scalar(key, value), key)
        elif key == "max_non_split_rounding_mb":
            fields["max_non_split_rounding_size"] = _mib_at_least_20(_scalar(key, value), key)
        elif key == "large_segment_size_mb":
            fields["large_segment_size"] = _int(_scalar(key, value), key) * MiB
        elif key == "garbage_collection_threshold":
            thr = _float(_scalar(key, value), key)
            if not 0.0 < thr < 1.0:
                raise ConfigError("garbage_collection_threshold must be in (0.0, 1.0)")
            fields["garbage_collection_threshold"] = thr
        elif key == "expandable_segments":
            fields["expandable_segments"] = _bool(_scalar(key, value), key)
        elif key == "per_process_memory_fraction":
            frac = _float(_scalar(key, value), key)
            if not 0.0 <= frac <= 1.0:
                raise ConfigError("per_process_memory_fraction must be in [0, 1]")
            fields["per_process_memory_fraction"] = frac
        else:
            raise ConfigError(f"unknown allocator setting {key!r}")
    fields["roundup_power2_divisions"] = tuple(fields["roundup_power2_divisions"])
    return AllocatorConfig(**fields)


def _parse_divisions(value: list[str], table: list[int]) -> None:
    """torch's parseRoundUpPower2Divisions: one power of two for every
    bucket, or '[<MiB>:<divisions>,...,>:<divisions>]'."""
    key = "roundup_power2_divisions"
    if value[0] != "[":
        v = _int(_scalar(key, value), key)
        if not _power_of_two(v):
            raise ConfigError(f"{key}: divisions must be a power of 2")
        table[:] = [v] * ROUNDUP_INTERVALS
        return
    if value[-1] != "]":
        raise ConfigError(f"{key}: missing ']'")
    entries = value[1:-1]
    first, last_index, i = True, 0, 0
    while i < len(entries):
        if i + 2 >= len(entries) or entries[i + 1] != ":":
            raise ConfigError(f"{key}: expected '<MiB>:<divisions>' entries")
        bound, v = entries[i], _int(entries[i + 2], key)
        if v != 0 and not _power_of_two(v):
            raise ConfigError(f"{key}: divisions must be a power of 2 or 0")
        if bound == ">":
            table[last_index + 1:] = [v] * (ROUNDUP_INTERVALS - last_index - 1)
        else:
            b = _int(bound, key)
            if not _power_of_two(b):
                raise ConfigError(f"{key}: interval bounds must be powers of 2")
            index = min(b.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                table[:index] = [v] * index
                first = False
            table[index] = v
            last_index = index
        i += 3
        if i < len(entries):
            if entries[i] != ",":
                raise ConfigError(f"{key}: expected ',' between entries")
            i += 1


def divisions_list(table: Any) -> list[int] | None:
    """roundup_power2_divisions in interval order: a baseline's list as it
    is, or the dict torch's snapshot writes ({"1": d, "2": d, ..., "32768": d},
    keyed by the interval's MiB; older imports kept it so). None if neither."""
    if isinstance(table, dict):
        try:
            return [int(v) for _, v in sorted(table.items(), key=lambda kv: int(kv[0]))]
        except (TypeError, ValueError):
            return None
    return [int(x) for x in table] if isinstance(table, (list, tuple)) else None


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
    table = divisions_list(config.get("roundup_power2_divisions"))
    if table:
        t = [int(x) for x in table][:ROUNDUP_INTERVALS]
        fields["roundup_power2_divisions"] = tuple(t + [0] * (ROUNDUP_INTERVALS - len(t)))
    else:
        fields["roundup_power2_divisions"] = tuple(fields["roundup_power2_divisions"])
    return AllocatorConfig(**fields)
