//! `cpu[:THRESHOLD]`: CPU load that is not ours, from `/proc`.

use super::*;

pub(super) const DEFAULT_CPU_THRESHOLD: f64 = 0.25;
/// How long the first `cpu` check samples when it has no earlier sample.
pub(super) const FIRST_CPU_SAMPLE: Duration = Duration::from_millis(100);

/// `0.25` or `25%` → 0.25.
pub(super) fn parse_cpu_threshold(arg: &str) -> anyhow::Result<f64> {
    let (number, scale) = match arg.trim().strip_suffix('%') {
        Some(percent) => (percent, 100.0),
        None => (arg.trim(), 1.0),
    };
    let value = number.trim().parse::<f64>().ok().map(|v| v / scale);
    match value {
        Some(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => bail!(
            "idle source 'cpu:{arg}': the threshold must be a fraction of all cores \
             from 0 to 1 (e.g. 0.25) or a percentage (e.g. 25%)"
        ),
    }
}

/// CPU time counters in clock ticks, summed over all cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CpuSample {
    /// Non-idle time of the whole machine.
    pub(super) busy: u64,
    /// All time of the whole machine, idle included.
    pub(super) total: u64,
    /// This process's user + system time.
    pub(super) ours: u64,
}

/// `/proc/stat` → (busy ticks, total ticks, number of cores).
pub(super) fn parse_proc_stat(text: &str) -> anyhow::Result<(u64, u64, usize)> {
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("/proc/stat has no 'cpu' line")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("/proc/stat: cannot read the numbers in '{line}'"))?;
    ensure!(
        fields.len() >= 4,
        "/proc/stat: the 'cpu' line has {} fields, expected at least 4",
        fields.len()
    );
    // user nice system idle iowait irq softirq steal; guest time is already in user and nice.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    let cores = text
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Ok((total - idle, total, cores.max(1)))
}

/// `/proc/self/stat` → this process's utime + stime in clock ticks.
pub(super) fn parse_self_stat(text: &str) -> anyhow::Result<u64> {
    // Field 2, the command name in parentheses, may hold spaces and ')': split at the last one.
    let (_, rest) = text
        .rsplit_once(')')
        .context("/proc/self/stat has no ')' after the command name")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let tick = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .context("/proc/self/stat is too short or malformed")
    };
    Ok(tick(11)? + tick(12)?)
}

/// The share of all cores used by other processes between two samples; `None` when no time passed.
pub(super) fn foreign_load(before: &CpuSample, after: &CpuSample) -> Option<f64> {
    let total = after.total.checked_sub(before.total).filter(|t| *t > 0)?;
    let busy = after.busy.saturating_sub(before.busy);
    let ours = after.ours.saturating_sub(before.ours);
    Some((busy.saturating_sub(ours) as f64 / total as f64).clamp(0.0, 1.0))
}

pub(super) fn read_cpu_sample() -> anyhow::Result<(CpuSample, usize)> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let own = std::fs::read_to_string("/proc/self/stat").context("cannot read /proc/self/stat")?;
    let (busy, total, cores) = parse_proc_stat(&stat)?;
    Ok((
        CpuSample {
            busy,
            total,
            ours: parse_self_stat(&own)?,
        },
        cores,
    ))
}

/// `cpu[:THRESHOLD]`: busy while other processes use more than `threshold` of all cores.
pub(super) struct CpuSource {
    pub(super) threshold: f64,
    pub(super) previous: Option<CpuSample>,
    pub(super) last: Verdict,
}

impl CpuSource {
    pub(super) fn open(threshold: f64) -> anyhow::Result<Self> {
        read_cpu_sample().context(
            "the 'cpu' idle source needs Linux's /proc; use --idle schedule:... or nvml",
        )?;
        Ok(Self {
            threshold,
            previous: None,
            last: Verdict::Busy("measuring the CPU load".to_owned()),
        })
    }
}

impl IdleSource for CpuSource {
    fn name(&self) -> &str {
        "cpu"
    }
    fn check(&mut self) -> Verdict {
        let before = match self.previous {
            Some(sample) => Ok(sample),
            None => read_cpu_sample().map(|(sample, _)| {
                std::thread::sleep(FIRST_CPU_SAMPLE);
                sample
            }),
        };
        let (before, (after, cores)) = match before.and_then(|b| Ok((b, read_cpu_sample()?))) {
            Ok(samples) => samples,
            Err(e) => return Verdict::Busy(format!("cannot measure the CPU load: {e:#}")),
        };
        let Some(load) = foreign_load(&before, &after) else {
            // Too soon to tell: keep the older sample so the next interval is longer.
            self.previous = Some(before);
            return self.last.clone();
        };
        self.previous = Some(after);
        self.last = if load > self.threshold {
            Verdict::Busy(format!(
                "other processes use {:.0} % of the CPU ({cores} cores; threshold {:.0} %)",
                load * 100.0,
                self.threshold * 100.0
            ))
        } else {
            Verdict::Idle { until: None }
        };
        self.last.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_STAT: &str = "cpu  100 5 50 800 20 3 2 0 10 0\n\
                             cpu0 50 2 25 400 10 1 1 0 5 0\n\
                             cpu1 50 3 25 400 10 2 1 0 5 0\n\
                             intr 12345 0 0\nctxt 999\n";

    #[test]
    fn reads_cpu_counters_from_proc_stat() {
        // busy: user + nice + system + irq + softirq + steal = 160; total adds idle + iowait.
        assert_eq!(parse_proc_stat(PROC_STAT).unwrap(), (160, 980, 2));
        assert!(parse_proc_stat("intr 1 2 3\n").is_err());
        assert!(parse_proc_stat("cpu  1 2 x 4\n").is_err());
    }

    #[test]
    fn reads_our_cpu_time_even_with_odd_command_names() {
        // utime (field 14) = 70, stime (field 15) = 30.
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 70 30 0 0 20 0 8 0";
        assert_eq!(parse_self_stat(stat).unwrap(), 100);
        assert!(parse_self_stat("4242 (short) S 1").is_err());
    }

    #[test]
    fn foreign_load_leaves_out_our_own_cpu_time() {
        let before = CpuSample {
            busy: 1000,
            total: 10_000,
            ours: 200,
        };
        // 400 ticks of 1000 busy, of which 300 were ours: 10 % foreign.
        let after = CpuSample {
            busy: 1400,
            total: 11_000,
            ours: 500,
        };
        assert!((foreign_load(&before, &after).unwrap() - 0.1).abs() < 1e-9);
        // Our accounting running ahead of the machine's never gives a negative load.
        let ahead = CpuSample {
            busy: 1100,
            total: 11_000,
            ours: 600,
        };
        assert_eq!(foreign_load(&before, &ahead), Some(0.0));
        assert_eq!(foreign_load(&before, &before), None);
    }

    #[test]
    fn cpu_thresholds_parse_as_fractions_or_percentages() {
        assert_eq!(parse_cpu_threshold("0.5").unwrap(), 0.5);
        assert_eq!(parse_cpu_threshold("40%").unwrap(), 0.4);
        for bad in ["1.5", "-0.1", "lots", "150%"] {
            let err = format!("{:#}", parse_spec(&format!("cpu:{bad}")).err().unwrap());
            assert!(err.contains("fraction of all cores"), "{err}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_source_measures_this_machine() {
        let mut cpu = parse_spec("cpu:1").unwrap();
        assert_eq!(cpu.name(), "cpu");
        // Threshold 1 (all cores) can never be exceeded; the first check samples for 100 ms.
        assert_eq!(cpu.check(), Verdict::Idle { until: None });
        assert_eq!(cpu.check(), Verdict::Idle { until: None });
        // `auto` falls back to `cpu` without an NVIDIA driver.
        assert!(["nvml", "cpu"].contains(&parse_spec("auto").unwrap().name()));
    }
}
