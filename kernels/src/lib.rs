//! msl device kernels (being built).
