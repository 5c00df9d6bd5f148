"""Export scikit-learn's 8x8 handwritten digits as .npy files for examples/mlp.

Run once, in a throwaway virtualenv (scikit-learn is not a dependency of msl):

    python3 -m venv /tmp/skl && /tmp/skl/bin/pip install scikit-learn numpy
    /tmp/skl/bin/python examples/mlp/data/export_digits.py

Writes, next to this script:
    digits_x.npy  float32 [1797, 64]  pixel values / 16, in [0, 1]
    digits_y.npy  int32   [1797]      labels 0..9
    train_x.npy   float32 [1437, 64]  first 1437 rows of a seeded permutation
    train_y.npy   int32   [1437]
    test_x.npy    float32 [360, 64]   remaining 360 rows
    test_y.npy    int32   [360]
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parent
SEED = 0
N_TEST = 360

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)  # [1797, 64], values 0..16 -> [0, 1]
y = digits.target.astype(np.int32)  # [1797]
assert x.shape == (1797, 64) and y.shape == (1797,)
assert x.min() == 0.0 and x.max() == 1.0

perm = np.random.default_rng(SEED).permutation(len(y))
train, test = perm[:-N_TEST], perm[-N_TEST:]

arrays = {
    "digits_x": x,
    "digits_y": y,
    "train_x": x[train],
    "train_y": y[train],
    "test_x": x[test],
    "test_y": y[test],
}
for name, a in arrays.items():
    np.save(OUT / f"{name}.npy", np.ascontiguousarray(a))
    print(f"{name}.npy {a.dtype} {list(a.shape)}")
