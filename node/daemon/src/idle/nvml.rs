//! `nvml[:PERCENT]`: foreign processes and utilization on NVIDIA GPUs, through NVML loaded at
//! run time.

use super::*;

pub(super) const DEFAULT_GPU_BUSY_PERCENT: u32 = 30;

pub(super) fn parse_gpu_percent(arg: &str) -> anyhow::Result<u32> {
    let number = arg.trim().trim_end_matches('%');
    match number.parse::<u32>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => bail!(
            "idle source 'nvml:{arg}': \
             the threshold must be a GPU utilization percentage from 0 to 100"
        ),
    }
}

/// `nvml[:PERCENT]`: busy while another process runs on any NVIDIA GPU, or while a GPU where we
/// have nothing running is more than PERCENT utilized (NVML cannot split utilization by process, so
/// on a GPU we use, utilization is assumed to be ours).
///
/// Only "fails cleanly without a driver" is tested (CI has no GPU). Known limit: inside a container
/// NVML reports host pids, so our own processes may look foreign there.
pub(super) struct NvmlSource {
    pub(super) nvml: nvml_wrapper::Nvml,
    pub(super) gpus: Vec<String>,
    pub(super) busy_percent: u32,
    pub(super) our_pid: u32,
}

impl NvmlSource {
    pub(super) fn open(busy_percent: u32) -> anyhow::Result<Self> {
        // nvml-wrapper loads `libnvidia-ml.so.1` (in every Linux driver install) at run time.
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| {
            anyhow::anyhow!(
                "the 'nvml' idle source needs an NVIDIA driver, and none could be loaded ({e}); \
                 use --idle cpu or --idle schedule:..."
            )
        })?;
        let count = nvml.device_count().context("NVML cannot count the GPUs")?;
        ensure!(
            count > 0,
            "the 'nvml' idle source found an NVIDIA driver but no GPU"
        );
        let gpus = (0..count)
            .map(|i| {
                let name = nvml
                    .device_by_index(i)
                    .and_then(|d| d.name())
                    .unwrap_or_else(|_| "unknown".to_owned());
                format!("GPU {i} ({name})")
            })
            .collect();
        Ok(Self {
            nvml,
            gpus,
            busy_percent,
            our_pid: std::process::id(),
        })
    }

    /// Why GPU `index` is busy, if it is.
    pub(super) fn gpu_busy(
        &self,
        index: u32,
    ) -> Result<Option<String>, nvml_wrapper::error::NvmlError> {
        use nvml_wrapper::error::NvmlError;
        let device = self.nvml.device_by_index(index)?;
        let listed = |r: Result<Vec<_>, NvmlError>| match r {
            Err(NvmlError::NotSupported) => Ok(Vec::new()),
            other => other,
        };
        let mut processes = listed(device.running_compute_processes())?;
        processes.extend(listed(device.running_graphics_processes())?);
        if let Some(other) = processes.iter().find(|p| p.pid != self.our_pid) {
            // Best effort: the pid may be in another pid namespace or already gone.
            let command =
                std::fs::read_to_string(format!("/proc/{}/comm", other.pid)).unwrap_or_default();
            let command = command.trim();
            return Ok(Some(if command.is_empty() {
                format!("process {} is running on it", other.pid)
            } else {
                format!("process {} ({command}) is running on it", other.pid)
            }));
        }
        if processes.is_empty() {
            match device.utilization_rates() {
                Ok(u) if u.gpu > self.busy_percent => {
                    return Ok(Some(format!(
                        "{} % utilized by other work (threshold {} %)",
                        u.gpu, self.busy_percent
                    )));
                }
                Ok(_) | Err(NvmlError::NotSupported) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

impl IdleSource for NvmlSource {
    fn name(&self) -> &str {
        "nvml"
    }
    fn check(&mut self) -> Verdict {
        let mut busy = Vec::new();
        for (index, gpu) in (0u32..).zip(&self.gpus) {
            match self.gpu_busy(index) {
                Ok(None) => {}
                Ok(Some(why)) => busy.push(format!("{gpu}: {why}")),
                Err(e) => busy.push(format!("{gpu}: cannot query NVML: {e}")),
            }
        }
        if busy.is_empty() {
            Verdict::Idle { until: None }
        } else {
            Verdict::Busy(busy.join("; "))
        }
    }
}

/// One NVIDIA GPU as NVML sees it (for `nightshift doctor`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    /// GPU utilization in percent, where NVML reports it.
    pub utilization_percent: Option<u32>,
    /// Compute and graphics processes running on it.
    pub processes: usize,
    pub driver_version: Option<String>,
}

/// The NVIDIA GPUs of this machine through NVML (`libnvidia-ml.so.1`, loaded at run time).
///
/// # Errors
/// When no NVIDIA driver can be loaded, or NVML cannot list the GPUs; the message says which.
pub fn gpu_inventory() -> anyhow::Result<Vec<GpuInfo>> {
    let nvml = nvml_wrapper::Nvml::init()
        .map_err(|e| anyhow::anyhow!("NVML could not be loaded ({e})"))?;
    let driver_version = nvml.sys_driver_version().ok();
    let count = nvml.device_count().context("NVML cannot count the GPUs")?;
    (0..count)
        .map(|index| {
            let d = nvml
                .device_by_index(index)
                .with_context(|| format!("NVML cannot open GPU {index}"))?;
            let memory = d.memory_info().ok();
            let processes = d.running_compute_processes().map_or(0, |p| p.len())
                + d.running_graphics_processes().map_or(0, |p| p.len());
            Ok(GpuInfo {
                index,
                name: d.name().unwrap_or_else(|_| "unknown".into()),
                memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
                memory_used_bytes: memory.as_ref().map_or(0, |m| m.used),
                utilization_percent: d.utilization_rates().ok().map(|u| u.gpu),
                processes,
                driver_version: driver_version.clone(),
            })
        })
        .collect()
}
