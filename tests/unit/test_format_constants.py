"""The format's numbers and rules live in one place per language
(csrc/format/ for C++, allocscope/capture/format.py for Python, docs/format.md
for people): the two languages agree, the spec lists every kind and chunk,
and no rule is written a second time anywhere else."""

import os
import pathlib
import re

import pytest

from allocscope.capture import format as F

from ..conftest import ROOT

pytestmark = pytest.mark.torch_agnostic


def test_python_constants_match_the_native_core(native):
    c = native.format_constants()
    assert c["magic"] == F.MAGIC
    assert c["version"] == F.FORMAT_VERSION
    assert c["header_size"] == F.HEADER.size
    assert c["chunk_header_size"] == F.CHUNK_HEADER.size
    assert (c["via_allocator"], c["kind_mask"]) == (F.VIA_ALLOCATOR, F.KIND_MASK)
    assert (c["first_annotation"], c["last_annotation"]) == (F.FIRST_ANNOTATION, F.LAST_ANNOTATION)
    assert (c["module_backward"], c["module_leaf"], c["module_restored"]) == (
        F.MODULE_BACKWARD, F.MODULE_LEAF, F.MODULE_RESTORED)
    assert c["kinds"] == {k.name: int(k) for k in F.EventKind}
    assert c["chunks"] == {k.name: int(k) for k in F.Chunk}
    assert c["encodings"] == {e.name: int(e) for e in F.Encoding}
    assert sorted(c["columns"], key=c["columns"].get) == list(F.COLUMNS)


def test_spec_documents_every_kind_and_chunk():
    with open(os.path.join(ROOT, "docs", "format.md")) as f:
        spec = f.read()
    for kind in F.EventKind:
        assert re.search(rf"\|\s*{int(kind)}\s*\|\s*`?{kind.name}`?\s*\|", spec), kind.name
    for chunk in F.Chunk:
        assert re.search(rf"\|\s*{int(chunk)}\s*\|\s*`?{chunk.name}`?\s*\|", spec), chunk.name


def test_the_chunk_checksum_is_the_one_the_recorder_writes(tmp_path):
    """Python's chunk_crc checks every chunk of a capture the C++ writer made."""
    import torch

    import allocscope

    path = tmp_path / "crc.alsc"
    with allocscope.record(path, device="cpu"):
        torch.empty(100)
    data = path.read_bytes()
    chunks = list(F.chunk_headers(data, F.HEADER.size))
    assert len(chunks) >= 3
    for kind, at, length, crc in chunks:
        payload = data[at + F.CHUNK_HEADER.size:at + F.CHUNK_HEADER.size + length]
        assert F.chunk_crc(kind, length, payload) == crc
        assert F.chunk_crc(kind, length, payload[:-1] + bytes([payload[-1] ^ 1])) != crc


_PY = [p for p in (pathlib.Path(ROOT) / "python").rglob("*.py")]
_CPP = [p for p in (pathlib.Path(ROOT) / "csrc").rglob("*") if p.suffix in (".h", ".cpp", ".inc")]

# A rule of the format: where it may be written, and what a second copy would look like.
RULES = {
    "the chunk checksum (Python)": (r"zlib\.crc32", _PY, {"python/allocscope/capture/format.py"}),
    "the chunk checksum (C++)": (r"\bcrc32\s*\(", _CPP, {"csrc/format/chunk.h", "csrc/format/chunk.cpp"}),
    "the module-scope flag bits (Python)": (r"^\s*_?[A-Z_]*(BACKWARD|LEAF)[A-Z_]*\s*=\s*\d", _PY,
                                            {"python/allocscope/capture/format.py"}),
    "the module-scope flag bits (C++)": (r"addr\s*&\s*[0-9]|\bkModule(Backward|Leaf)\s*=", _CPP,
                                         {"csrc/format/format.h"}),
    "the column encodings (C++)": (r"\b(kRaw|kConst|kDense|kSparse|kEnc\w+)\s*=", _CPP, {"csrc/format/format.h"}),
    "the event kinds (C++)": (r"\bkAlloc\b\s*=|\bX\(kAlloc,", _CPP, {"csrc/format/format.h"}),
    "the event kinds (Python)": (r"^\s*(ALLOC|MODULE_ENTER)\s*=\s*\d", _PY, {"python/allocscope/capture/format.py"}),
    "the kind table given to Python (C++)": (r"kinds\[\"\w+\"\]", _CPP, set()),
    "the format version (Python)": (r"^FORMAT_VERSION\s*=", _PY, {"python/allocscope/capture/format.py"}),
}


@pytest.mark.parametrize("rule", RULES)
def test_each_format_rule_is_written_once(rule):
    pattern, files, allowed = RULES[rule]
    where = {str(p.relative_to(ROOT)) for p in files if re.search(pattern, p.read_text(errors="replace"), re.M)}
    assert where == allowed, f"{rule} is written in {sorted(where)}"


def test_the_package_version_is_written_once():
    """setup.py reads it from allocscope/_version.py."""
    setup = (pathlib.Path(ROOT) / "setup.py").read_text()
    assert not re.search(r"version\s*=\s*[\"']\d", setup)
    from allocscope import __version__
    from setup import _version

    assert _version() == __version__
