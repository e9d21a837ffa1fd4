"""The format's numbers live in csrc/format.h; Python mirrors them."""

import os
import re

from allocscope import _format as F

from ..conftest import ROOT


def test_python_constants_match_the_native_core(native):
    c = native.format_constants()
    assert c["magic"] == F.MAGIC
    assert c["version"] == F.FORMAT_VERSION
    assert c["chunk_header_size"] == F.CHUNK_HEADER.size
    assert c["via_allocator"] == F.VIA_ALLOCATOR
    assert c["kinds"] == {k.name: int(k) for k in F.EventKind}
    assert c["chunks"] == {k.name: int(k) for k in F.Chunk}


def test_spec_documents_every_kind_and_chunk():
    with open(os.path.join(ROOT, "docs", "format.md")) as f:
        spec = f.read()
    for kind in F.EventKind:
        assert re.search(rf"\|\s*{int(kind)}\s*\|\s*`?{kind.name}`?\s*\|", spec), kind.name
    for chunk in F.Chunk:
        assert re.search(rf"\|\s*{int(chunk)}\s*\|\s*`?{chunk.name}`?\s*\|", spec), chunk.name
