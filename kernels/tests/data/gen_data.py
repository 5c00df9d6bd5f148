# Run from kernels/tests/data: writes the small reference files the I/O tests read.
import numpy as np, safetensors.numpy as st
np.save("f8_fortran.npy", np.asfortranarray(np.arange(6, dtype="<f8").reshape(2, 3) / 4))
np.save("i8_big.npy", np.array([[-3, 2**31 - 1], [5, -2**31]], dtype=">i8"))
np.save("u1.npy", np.array([0, 7, 255], dtype="|u1"))
np.save("i2.npy", np.array([-300, 12], dtype="<i2"))
np.save("b1.npy", np.array([True, False, True], dtype="|b1"))
np.save("f4_scalar.npy", np.float32(2.5))
np.save("f4_big.npy", np.array([1.5, -2.25], dtype=">f4"))
np.save("f2.npy", np.array([0.5, -1.0, 65504.0, 6e-8], dtype="<f2"))
np.save("i8_overflow.npy", np.array([1, 2**40], dtype="<i8"))
from numpy.lib import format as fmt
with open("f4_v2.npy", "wb") as f:
    fmt.write_array(f, np.array([[1.0, 2.0]], dtype="<f4"), version=(2, 0))
with open("f4_v3.npy", "wb") as f:
    fmt.write_array(f, np.array([3.0], dtype="<f4"), version=(3, 0))
np.savez_compressed("two.npz", x=np.arange(4, dtype="<f4").reshape(2, 2), labels=np.array([1, 0, 2], dtype="<i8"))
st.save_file({"h": np.array([1.0, -0.5, 0.099975586], dtype=np.float16),
              "ids": np.array([[1, -2], [3, 2**31 - 1]], dtype=np.int64),
              "mask": np.array([True, False])}, "mixed.safetensors")
