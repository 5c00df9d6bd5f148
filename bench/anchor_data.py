#!/usr/bin/env python3
"""Writes the anchors' W3 and W5 data and initial weights (../shared/bench/anchors/bench.py's own
data functions, so every framework starts from the same numbers) as files msl loads: a safetensors
file per model and .npy inputs.

Usage: anchor_data.py ANCHORS_DIR OUT_DIR [--batch B]   (needs numpy: run it with the bench venv)
W5's fused `wqkv` (D, 3D) is split into wq, wk, wv by columns, which is what the anchors'
reshape to (B, S, 3, H, dh) does, so the split block computes the same function.
"""
import json, os, struct, sys


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        data = a.tobytes()
        dtype = {"float32": "F32", "int32": "I32"}[str(a.dtype)]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    anchors, out = sys.argv[1], sys.argv[2]
    batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else None
    sys.path.insert(0, anchors)
    import numpy as np
    import bench as anchor
    if batch:
        anchor.MLP_B = batch
    os.makedirs(out, exist_ok=True)
    tag = f"_b{anchor.MLP_B}"
    params, x, y = anchor.data_mlp(np)
    names = [n for i in (1, 2, 3) for n in (f"w{i}", f"b{i}")]
    write_safetensors(os.path.join(out, f"w3{tag}.safetensors"),
                      list(zip(names, [t for wb in params for t in wb])))
    np.save(os.path.join(out, f"w3{tag}_x.npy"), x)
    np.save(os.path.join(out, f"w3{tag}_y.npy"), y.astype(np.int32))
    p, x, t = anchor.data_tf(np)
    d = anchor.TF_D
    split = {"wq": p["wqkv"][:, :d], "wk": p["wqkv"][:, d:2 * d], "wv": p["wqkv"][:, 2 * d:],
             "bq": p["bqkv"][:d], "bk": p["bqkv"][d:2 * d], "bv": p["bqkv"][2 * d:]}
    order = ["ln1_g", "ln1_b", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln2_g", "ln2_b", "w1", "b1", "w2", "b2"]
    write_safetensors(os.path.join(out, "w5.safetensors"),
                      [(k, np.ascontiguousarray(split.get(k, p.get(k)))) for k in order])
    np.save(os.path.join(out, "w5_x.npy"), x)
    np.save(os.path.join(out, "w5_t.npy"), t)


if __name__ == "__main__":
    main()
