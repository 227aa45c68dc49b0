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

/// Runs a small matrix product on the GPU through burn-cuda and checks its result: whether
/// training on CUDA can work here. Call only when [`cuda_available`] holds (burn-cuda panics on
/// a worker thread without a driver); a panic inside is caught and reported.
///
/// # Errors
/// What went wrong, for people.
#[cfg(feature = "cuda")]
pub fn cuda_smoke_test() -> Result<(), String> {
    use burn::tensor::Tensor;
    let run = || {
        let device = Default::default();
        let a = Tensor::<Cuda, 2>::ones([64, 64], &device);
        a.clone().matmul(a).sum().into_data().to_vec::<f32>()
    };
    match std::panic::catch_unwind(run) {
        Ok(Ok(v)) if v.first() == Some(&(64.0 * 64.0 * 64.0)) => Ok(()),
        Ok(Ok(v)) => Err(format!(
            "a 64×64 matrix product on the GPU gave {v:?}, not 262144"
        )),
        Ok(Err(e)) => Err(format!("the GPU's result could not be read: {e:?}")),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "burn-cuda panicked".into())),
    }
}

/// The CPU device.
pub fn cpu_device() -> burn::backend::flex::FlexDevice {
    burn::backend::flex::FlexDevice
}
