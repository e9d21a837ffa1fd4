"""Column encoding: the C++ writer and the Python encoder agree, and decoding
inverts both, on values chosen to hit every encoding and edge."""

import numpy as np
import pytest

from allocscope.capture import codec
from allocscope.capture import format as F

pytestmark = pytest.mark.torch_agnostic

CASES = [
    [0],
    [5] * 100,  # constant
    [0] * 99 + [7],  # sparse
    [0, 3, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    list(range(300)),  # dense, 1- and 2-byte varints
    [2**64 - 1, 0, 2**63, 1, 127, 128, 16383, 16384],  # extremes
    [2**64 - 1] * 3,
]


@pytest.mark.parametrize("values", CASES)
def test_native_and_python_encoders_agree_and_roundtrip(harness, values):
    encoded = harness.encode_column(values)
    assert encoded == codec.encode_column(values)
    decoded, end = codec.decode_column(memoryview(encoded), 0, len(values))
    assert end == len(encoded)
    assert decoded.tolist() == values


def test_random_columns_roundtrip(harness):
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 500))
        bits = int(rng.integers(1, 65))
        values = rng.integers(0, 2**min(bits, 63), n, dtype=np.uint64)
        values[rng.random(n) < rng.random()] = 0  # vary the sparsity
        encoded = harness.encode_column(values.tolist())
        decoded, _ = codec.decode_column(memoryview(encoded), 0, n)
        np.testing.assert_array_equal(decoded, values)


def test_encoder_picks_the_smallest_encoding():
    assert codec.encode_column([4] * 1000)[0] == F.Encoding.CONST
    assert codec.encode_column([0] * 999 + [1])[0] == F.Encoding.SPARSE
    assert codec.encode_column(list(range(1, 1000)))[0] == F.Encoding.DENSE


@pytest.mark.parametrize("bad", [
    b"\x80",  # unterminated
    b"\xff" * 10 + b"\x01",  # 11 bytes
    b"\xff" * 9 + b"\x02",  # 10 bytes but more than 64 bits
])
def test_invalid_varints_raise_format_error(bad):
    with pytest.raises(F.FormatError):
        codec.decode_varints(np.frombuffer(bad, np.uint8), 1)
    with pytest.raises(F.FormatError):
        F.read_varint(bad, 0)


def test_decode_varints_requires_exact_count():
    buf = np.frombuffer(F.varint(1) + F.varint(300), np.uint8)
    assert codec.decode_varints(buf, 2).tolist() == [1, 300]
    with pytest.raises(F.FormatError):
        codec.decode_varints(buf, 1)
    with pytest.raises(F.FormatError):
        codec.decode_varints(buf, 3)


def test_sparse_column_with_out_of_range_index_is_rejected():
    payload = bytes([F.Encoding.SPARSE]) + F.varint(1) + F.varint(2) + F.varint(10) + F.varint(5)
    with pytest.raises(F.FormatError):
        codec.decode_column(memoryview(payload), 0, 5)
