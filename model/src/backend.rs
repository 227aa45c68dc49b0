//! Backend selection.
//!
//! The CPU backend is burn-flex. With the `cuda` feature, [`cuda_available`] checks for the driver
//! before the CUDA backend is used (burn-cuda panics on a worker thread when there is none).

use burn::backend::{Autodiff, Flex};

/// The CPU backend used for training and evaluation.
pub type Cpu = Flex;
/// The CPU backend with autodiff, for the inner loop.
pub type CpuTrain = Autodiff<Cpu>;

/// The CUDA backend (feature `cuda`).
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda;
/// The CUDA backend with autodiff (feature `cuda`).
#[cfg(feature = "cuda")]
pub type CudaTrain = Autodiff<Cuda>;

/// Whether an NVIDIA driver can be loaded on this machine.
pub fn cuda_available() -> bool {
    [
        "libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
        || std::env::var_os("LD_LIBRARY_PATH").is_some_and(|dirs| {
            std::env::split_paths(&dirs).any(|d| d.join("libcuda.so.1").exists())
        })
}

/// The CPU device.
pub fn cpu_device() -> burn::backend::flex::FlexDevice {
    burn::backend::flex::FlexDevice
}
