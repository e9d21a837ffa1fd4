"""The capture file format, Python side: its numbers, its rules (the chunk
checksum, the module-scope flags, varints) and its chunk framing; the event
columns' encodings are in codec.py.

csrc/format/format.h is the reference for the numbers (tests check that both
agree) and docs/format.md the byte-for-byte specification. Decoding is pure
Python and numpy, so reading a file, even a malicious one, can only fail
with an exception: it never runs code and needs neither torch nor the
extension.
"""

from __future__ import annotations

import enum
import json
import struct
import zlib
from typing import Iterator

__all__ = ["CHUNK_HEADER", "COLUMNS", "CPU_STREAM", "Chunk", "Encoding", "EventKind", "FIRST_ANNOTATION",
           "FORMAT_VERSION", "FormatError", "HEADER", "KIND_MASK", "LAST_ANNOTATION", "MAGIC", "MAX_CHUNK",
           "MODULE_BACKWARD", "MODULE_LEAF", "MODULE_RESTORED", "NO_STREAM", "READABLE_VERSIONS", "TENSOR_LABELS",
           "VIA_ALLOCATOR",
           "chunk", "chunk_crc", "chunk_headers", "columns_of", "file_header", "kind_name", "parse_json_object",
           "read_varint", "table_entries", "varint", "zigzag"]

MAGIC = b"\x89ALS\r\n\x1a\n"
FORMAT_VERSION = 2
# Version 1 files have no op column; they load with every op 0 (no op).
READABLE_VERSIONS = (1, 2)
HEADER = struct.Struct("<8sII")  # magic, version, flags
CHUNK_HEADER = struct.Struct("<BBHII")  # type, 0, 0, length, crc
VIA_ALLOCATOR = 0x80
KIND_MASK = 0x7F
FIRST_ANNOTATION = 16
LAST_ANNOTATION = 63
MAX_CHUNK = 1 << 30  # no writer makes chunks this large; larger lengths are corrupt


class Chunk(enum.IntEnum):
    METADATA = 1
    STRINGS = 2
    FRAMES = 3
    STACKS = 4
    THREADS = 5
    STREAMS = 6
    EVENTS = 7
    BASELINE = 8
    FOOTER = 9
    CHECKPOINT = 10


class EventKind(enum.IntEnum):
    """What an event records. See docs/format.md for each kind's fields."""

    ALLOC = 1
    FREE = 2
    FREE_COMPLETED = 3
    SEGMENT_ALLOC = 4
    SEGMENT_FREE = 5
    SEGMENT_MAP = 6
    SEGMENT_UNMAP = 7
    OOM = 8
    EMPTY_CACHE = 9
    SET_FRACTION = 10
    SNAPSHOT = 11
    # Private memory pools (CUDA graph captures, torch.cuda.MemPool)
    POOL_BEGIN = 12
    POOL_END = 13
    POOL_RELEASE = 14
    POOL_ALLOC = 15
    MARK = 16
    # Annotations written by allocscope.watch (docs/format.md, docs/attribution.md)
    MODULE_ENTER = 17
    MODULE_EXIT = 18
    PHASE = 19
    WATCH = 20
    PARAMETER = 21
    BUFFER = 22
    GRADIENT = 23
    OPTIMIZER_STATE = 24
    ACTIVATION = 25
    INPUT = 26


#: Tensor-label kinds, highest priority first: an allocation labelled twice
#: (a parameter saved for backward) keeps the first category in this order.
TENSOR_LABELS = (EventKind.PARAMETER, EventKind.BUFFER, EventKind.GRADIENT, EventKind.OPTIMIZER_STATE,
                 EventKind.INPUT, EventKind.ACTIVATION)


def kind_name(kind: int) -> str:
    """An event kind's name as the CLI and JSON spell it (alloc, segment_map,
    ...); unknown kinds by number."""
    try:
        return EventKind(kind).name.lower()
    except ValueError:
        return f"annotation{kind}" if FIRST_ANNOTATION <= kind <= LAST_ANNOTATION else f"kind{kind}"


class Encoding(enum.IntEnum):
    RAW = 0
    CONST = 1
    DENSE = 2
    SPARSE = 3


COLUMNS = ("kind", "time", "thread", "stream", "addr", "size", "block", "stack", "arg", "op")


def columns_of(version: int) -> tuple[str, ...]:
    """The event columns a file of this format version stores."""
    return COLUMNS if version >= 2 else COLUMNS[:-1]


# MODULE_ENTER/EXIT's addr bits (docs/format.md).
MODULE_BACKWARD = 1  # a module's backward scope, written from autograd's hooks
MODULE_LEAF = 2  # a module with no children (its EXIT's size: bytes of its new outputs)
MODULE_RESTORED = 4  # an ENTER or EXIT a checkpoint wrote (docs/format.md, CHECKPOINT)

NO_STREAM = 0
CPU_STREAM = 1


class FormatError(ValueError):
    """The bytes do not follow the format (raised by the decoders)."""


# ---------------------------------------------------------------------------
# Decoding


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Reads one LEB128 varint at pos; returns (value, next position)."""
    value = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise FormatError("varint runs past the end of its chunk")
        b = data[pos]
        pos += 1
        if shift == 63 and b > 1:
            raise FormatError("varint does not fit in 64 bits")
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FormatError("varint longer than 10 bytes")


def chunk_headers(data: bytes | memoryview, pos: int) -> Iterator[tuple[int, int, int, int]]:
    """(kind, header position, payload length, crc) of the chunks from pos
    on, from their headers alone (payloads neither read nor checked); a
    damaged header or a file cut short ends the walk."""
    end = len(data)
    while pos + CHUNK_HEADER.size <= end:
        kind, zero1, zero2, length, crc = CHUNK_HEADER.unpack_from(data, pos)
        if zero1 or zero2 or length > MAX_CHUNK or pos + CHUNK_HEADER.size + length > end:
            return
        yield kind, pos, length, crc
        pos += CHUNK_HEADER.size + length


def table_entries(payload: memoryview, expected_first: int) -> tuple[int, int]:
    """Reads a table chunk's (first id, count) and checks it continues the table."""
    first, pos = read_varint(payload, 0)
    count, pos = read_varint(payload, pos)
    if first != expected_first:
        raise FormatError(f"table chunk starts at id {first}, expected {expected_first}")
    if count > len(payload):
        raise FormatError("table entry count is inconsistent with the chunk size")
    return count, pos


def parse_json_object(payload: memoryview, what: str) -> dict:
    try:
        value = json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise FormatError(f"{what} is not a JSON object")
    return value


def chunk_crc(kind: int, length: int, payload: bytes | memoryview) -> int:
    """A chunk's checksum: CRC-32 (zlib's) of its type byte, its length (4
    bytes, little endian) and its payload; a torn or flipped chunk fails it."""
    return zlib.crc32(payload, zlib.crc32(struct.pack("<I", length), zlib.crc32(bytes([kind]))))


# ---------------------------------------------------------------------------
# Encoding (synthetic captures and tests; the recorder encodes in C++)


def varint(value: int) -> bytes:
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> int:
    return ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)


def chunk(kind: int, payload: bytes) -> bytes:
    return CHUNK_HEADER.pack(kind, 0, 0, len(payload), chunk_crc(kind, len(payload), payload)) + payload


def file_header(version: int = FORMAT_VERSION) -> bytes:
    return HEADER.pack(MAGIC, version, 0)


