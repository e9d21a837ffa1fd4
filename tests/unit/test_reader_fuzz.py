"""Reader robustness on damaged real captures: truncations, flipped bits,
overwritten chunk headers and spliced chunks. Every case must load a valid
prefix or raise CaptureError: never another exception, a crash or a hang.

Mutations are random with fixed seeds (reproducible). The loop runs in a child
process with a timeout, so that a hang fails the test instead of the suite."""

import json
import os

import pytest

from ..conftest import DATA, run_python

pytestmark = pytest.mark.torch_agnostic

FUZZ = r'''
import json, random, struct, sys, warnings
import allocscope
from allocscope.capture import format as F

data = open(sys.argv[1], "rb").read()
rng = random.Random(int(sys.argv[2]))
cases = int(sys.argv[3])
# Chunk boundaries, so that some mutations hit headers exactly.
bounds, pos = [], F.HEADER.size
while pos + F.CHUNK_HEADER.size <= len(data):
    bounds.append(pos)
    pos += F.CHUNK_HEADER.size + struct.unpack_from("<I", data, pos + 4)[0]

def mutate(b):
    b = bytearray(b)
    op = rng.randrange(7)
    if op == 0:
        del b[rng.randrange(len(b)):]
    elif op == 1:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b)); b[i] ^= 1 << rng.randrange(8)
    elif op == 2:
        at = rng.choice(bounds)
        b[at:at + 12] = bytes(rng.randrange(256) for _ in range(12))
    elif op == 3:
        at = rng.choice(bounds)
        b[at + 4:at + 8] = struct.pack("<I", rng.choice([0, 1, 2**31, 2**32 - 1, rng.randrange(2**32)]))
    elif op == 4:
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        b[i:i] = b[i:j]
    elif op == 5:
        b[8:12] = struct.pack("<I", rng.randrange(2**32))
    else:
        # A forged chunk with a valid checksum: structure checks must catch it.
        at = rng.choice(bounds)
        kind = rng.choice(list(F.Chunk))
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        b[at:at] = F.chunk(kind, payload)
    return bytes(b)

outcomes = {"loaded": 0, "capture_error": 0}
for case in range(cases):
    blob = mutate(data)
    path = sys.argv[4]
    with open(path, "wb") as f:
        f.write(blob)
    for salvage in (False, True):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cap = allocscope.load(path, salvage=salvage)
            len(cap.events); [cap.stack(s) for s in set(cap.events.stack.tolist())]
            outcomes["loaded"] += 1
        except allocscope.CaptureError as e:
            assert str(e), "errors must say what is wrong"
            outcomes["capture_error"] += 1
print(json.dumps(outcomes))
'''


def test_damaged_captures_load_a_prefix_or_raise_capture_error(tmp_path):
    fixture = os.path.join(DATA, "cpu_train_v1.alsc")
    result = run_python(FUZZ, fixture, "1234", "600", str(tmp_path / "m.alsc"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout)
    # Both outcomes occur: the mutations are neither all fatal nor all harmless.
    assert outcomes["loaded"] > 50 and outcomes["capture_error"] > 50
