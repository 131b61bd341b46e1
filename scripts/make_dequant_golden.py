#!/usr/bin/env python3
"""Writes tests/golden/dequant_golden.txt: random GGUF quant blocks and the
values the `gguf` Python package (llama.cpp's reference numpy dequantizer)
decodes them to. dequant_test.cpp checks our reference against it.

Format, one record per type: a line "<TYPE> <n_blocks>", a line with the block
bytes in hex, a line with the decoded floats (%.9g, space-separated).
Usage: python3 scripts/make_dequant_golden.py [out_path]
"""
import sys
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from gguf.constants import GGML_QUANT_SIZES

# offsets of the f16 scale fields inside one block: random bytes there could be
# NaN/Inf, so they are overwritten with finite values.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}

def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/dequant_golden.txt"
    rng = np.random.default_rng(1234)
    lines = []
    for qt, fields in F16_FIELDS.items():
        block_size, type_size = GGML_QUANT_SIZES[qt]
        n_blocks = 3
        raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        for b in range(n_blocks):
            for off in fields:
                v = np.float16(rng.uniform(-0.5, 0.5))
                raw[b, off:off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        vals = dequantize(raw.reshape(-1), qt).reshape(-1).astype(np.float32)
        assert vals.size == n_blocks * block_size and np.all(np.isfinite(vals))
        lines.append(f"{qt.name} {n_blocks}")
        lines.append(raw.tobytes().hex())
        lines.append(" ".join("%.9g" % v for v in vals))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
