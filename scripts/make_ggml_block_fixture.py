#!/usr/bin/env python3
"""Write tests/fixtures/ggml_blocks.json: llama.cpp's dequantization of a few
Q3_K, Q2_K, Q5_0, Q5_1, IQ4_NL and IQ4_XS blocks, the expected values of the
block decoder's test (src/kernels/ggml/tests.rs).

The values come from the `gguf` package's numpy dequantizer (gguf-py, part
of llama.cpp), independently of moestream's code. The blocks are random
bytes with their f16 scales set to finite values of both signs (and zero),
plus all-zero and all-one bit patterns. Run it in a venv outside the repo:

    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf numpy
    /tmp/venv-gguf/bin/python scripts/make_ggml_block_fixture.py
"""

import importlib.metadata
import json
import os

import numpy as np
from gguf import GGMLQuantizationType, quants

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "ggml_blocks.json")
COMMAND = "python scripts/make_ggml_block_fixture.py (gguf %s, numpy %s)"

# Type: (bytes per block, byte offsets of its f16 scales).
TYPES = {
    "Q3_K": (GGMLQuantizationType.Q3_K, 110, [108]),
    "Q2_K": (GGMLQuantizationType.Q2_K, 84, [80, 82]),
    "Q5_0": (GGMLQuantizationType.Q5_0, 22, [0]),
    "Q5_1": (GGMLQuantizationType.Q5_1, 24, [0, 2]),
    "IQ4_NL": (GGMLQuantizationType.IQ4_NL, 18, [0]),
    "IQ4_XS": (GGMLQuantizationType.IQ4_XS, 136, [0]),
}
# The 32-value types get 8 blocks a scale (256 values, as many as the others).
PER_SCALE = {"Q5_0": 8, "Q5_1": 8, "IQ4_NL": 8}
SCALES = [0.5, -0.03125, 1.0e-3, 0.0, 2.0]


def blocks(rng, size, offsets, per_scale=1):
    out = []
    for k, s in enumerate(SCALES):
        for _ in range(per_scale):
            b = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
            if k == 3:
                b = bytearray([0xFF] * size)
            if k == 4:
                b = bytearray(size)
            for i, at in enumerate(offsets):
                v = s if i == 0 else abs(s) / 2 + 0.25
                b[at:at + 2] = np.float16(v).tobytes()
            out.append(bytes(b))
    return b"".join(out)


def main():
    rng = np.random.default_rng(30)
    version = importlib.metadata.version("gguf")
    doc = {"command": COMMAND % (version, np.__version__)}
    for name, (qtype, size, offsets) in TYPES.items():
        raw = blocks(rng, size, offsets, PER_SCALE.get(name, 1))
        values = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
        values = np.asarray(values, dtype="<f4").reshape(-1)
        doc[name] = {"blocks": raw.hex(), "values_f32_le": values.tobytes().hex()}
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
