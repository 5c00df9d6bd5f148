"""Checkpoint write and read throughput of 1 GiB (four f32 tensors of 256 MiB): msl's checkpoint
folder (`kernels/examples/ckpt_bench.rs`, what `save("dir/", …)` and `load("dir/")` call)
against Python's `safetensors` (save_file / load_file) and `numpy.save` / `numpy.load`, in
alternating rounds of one run. Prints one JSON line per measurement and the medians.

    python bench/ckpt.py BIN DIR [ROUNDS [MSL]]   (bench/ckpt.sh builds BIN and makes a venv)

With MSL (the msl binary) it also times `msl run` loading the checkpoint into a model of four
such tensors end to end (`let m: Big = load("ckpt/")`: the time of that program minus that of an
empty one). Its save needs no such row: `save` hands the model's own tensors to the same
writer, with no copy.
"""
import json, os, shutil, statistics, subprocess, sys, time

import numpy as np
import safetensors.numpy

BIN, DIR = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
MSL = os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else None
BIG = "model Big {\n" + "".join(f"    {f}: f32[65536, 1024] = full({k}.5, 65536, 1024)\n" for k, f in enumerate("abcd")) + "}\n"
PROGRAMS = {
    "save.msl": BIG + "fn main() {\n    let m = init(Big, seed: 0)\n    save(\"ckpt/\", m)\n    print(params(m))\n}\n",
    "load.msl": BIG + "fn main() {\n    let m: Big = load(\"ckpt/\")\n    print(params(m))\n}\n",
    "empty.msl": "fn main() {\n    print(268435456)\n}\n",
}
PER = (1 << 30) // 4 // 4
arrays = {f"layers.{k}.w": ((np.arange(PER, dtype=np.int64) * 7 + k) % 1000).astype(np.float32).reshape(-1, 1024) * np.float32(0.001)
          for k in range(4)}
BYTES = sum(a.nbytes for a in arrays.values())
results = {}


def record(name, write_s, read_s):
    row = {"impl": name, "bytes": BYTES, "write_s": round(write_s, 4), "read_s": round(read_s, 4),
           "write_gbs": round(BYTES / write_s / 1e9, 3), "read_gbs": round(BYTES / read_s / 1e9, 3)}
    results.setdefault(name, []).append(row)
    print(json.dumps(row), flush=True)


def fresh(path):
    """An empty folder, with every dirty page of earlier rounds on disk first, so that one
    round's write-back does not throttle the next one's writes."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    os.sync()


def st_round(sync):
    d = os.path.join(DIR, "st")
    fresh(d)
    path = os.path.join(d, "model.safetensors")
    t = time.perf_counter()
    safetensors.numpy.save_file(arrays, path, metadata={"format": "pt"})
    if sync:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    w = time.perf_counter() - t
    t = time.perf_counter()
    back = safetensors.numpy.load_file(path)
    r = time.perf_counter() - t
    assert all(np.array_equal(back[k], v) for k, v in arrays.items())
    record("safetensors" + ("+fsync" if sync else ""), w, r)


def np_round(sync):
    d = os.path.join(DIR, "np")
    fresh(d)
    path = os.path.join(d, "model.npy")
    t = time.perf_counter()
    with open(path, "wb") as f:
        for v in arrays.values():
            np.save(f, v)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    w = time.perf_counter() - t
    t = time.perf_counter()
    with open(path, "rb") as f:
        back = [np.load(f) for _ in arrays]
    r = time.perf_counter() - t
    assert all(np.array_equal(b, v) for b, v in zip(back, arrays.values()))
    record("numpy.save" + ("+fsync" if sync else ""), w, r)


def msl_round():
    d = os.path.join(DIR, "msl")
    fresh(d)
    out = subprocess.run([BIN, os.path.join(d, "ckpt/")], check=True, capture_output=True, text=True).stdout
    row = json.loads(out)
    record("msl", row["write_s"], row["read_s"])


def timed(d, prog):
    t = time.perf_counter()
    out = subprocess.run([MSL, "run", prog], cwd=d, check=True, capture_output=True, text=True).stdout
    assert out.strip() == "268435456", out
    return time.perf_counter() - t


def msl_e2e_round():
    d = os.path.join(DIR, "e2e")
    fresh(d)
    for name, text in PROGRAMS.items():
        open(os.path.join(d, name), "w").write(text)
    timed(d, "save.msl")
    load = timed(d, "load.msl") - timed(d, "empty.msl")
    results.setdefault("msl run: load", []).append({"read_gbs": round(BYTES / load / 1e9, 3)})
    print(json.dumps({"impl": "msl run: load", "bytes": BYTES, "read_s": round(load, 4)}), flush=True)


for _ in range(ROUNDS):
    msl_round()
    if MSL:
        msl_e2e_round()
    st_round(False)
    np_round(False)
    st_round(True)
    np_round(True)
shutil.rmtree(DIR, ignore_errors=True)

print("median and best of", ROUNDS, "rounds (GB/s = 1e9 bytes/s):")
for name, rows in results.items():
    r = [r["read_gbs"] for r in rows]
    read = f"read {statistics.median(r):5.2f} (best {max(r):5.2f})"
    if "write_gbs" in rows[0]:
        w = [r["write_gbs"] for r in rows]
        print(f"  {name:18s} write {statistics.median(w):5.2f} (best {max(w):5.2f})   {read}")
    else:
        print(f"  {name:18s} {'':29s}{read}")
