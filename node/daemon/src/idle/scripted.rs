//! Scripted and manual sources: `always`, `file:PATH`, `cycle:PERIOD:IDLE:PHASE`, and the owner's
//! pause flag.

use super::*;

/// `always`: idle all the time.
pub(super) struct Always;

impl IdleSource for Always {
    fn name(&self) -> &str {
        "always"
    }
    fn check(&mut self) -> Verdict {
        Verdict::Idle { until: None }
    }
}

/// The manual pause flag, toggled by `nightshift pause`/`resume`: busy ("paused by the owner")
/// while set.
pub struct Manual(pub Arc<AtomicBool>);

impl IdleSource for Manual {
    fn name(&self) -> &str {
        "manual"
    }
    fn check(&mut self) -> Verdict {
        if self.0.load(Ordering::Acquire) {
            Verdict::Busy("paused by the owner".to_owned())
        } else {
            Verdict::Idle { until: None }
        }
    }
}

/// `file:PATH`: a scripted source that reads PATH on every check.
pub(super) struct FileSource {
    pub(super) path: PathBuf,
}

impl IdleSource for FileSource {
    fn name(&self) -> &str {
        "file"
    }
    fn check(&mut self) -> Verdict {
        let shown = self.path.display();
        match std::fs::read_to_string(&self.path) {
            Ok(text) => file_verdict(&shown.to_string(), &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Verdict::Busy(format!("{shown} does not exist"))
            }
            Err(e) => Verdict::Busy(format!("cannot read {shown}: {e}")),
        }
    }
}

/// The verdict of a `file:` source whose file at `shown` holds `text`.
pub(super) fn file_verdict(shown: &str, text: &str) -> Verdict {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim();
    if first != "idle" {
        return Verdict::Busy(if first.is_empty() {
            format!("{shown} is empty")
        } else {
            format!("{shown} says '{first}'")
        });
    }
    let Some(line) = lines.map(str::trim).find(|l| !l.is_empty()) else {
        return Verdict::Idle { until: None };
    };
    let secs = line
        .strip_prefix("until=")
        .and_then(|s| s.trim().parse::<f64>().ok());
    match secs.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        Some(d) => Verdict::Idle {
            until: UNIX_EPOCH.checked_add(d),
        },
        None => Verdict::Busy(format!(
            "{shown}: second line '{line}' is not 'until=<unix seconds>'"
        )),
    }
}

/// `cycle:PERIOD:IDLE:PHASE`: idle for the first IDLE seconds of every PERIOD, shifted by PHASE.
#[derive(Debug)]
pub(super) struct Cycle {
    pub(super) started: Instant,
    pub(super) period: f64,
    pub(super) idle: f64,
    pub(super) phase: f64,
}

impl Cycle {
    pub(super) fn parse(arg: &str, started: Instant) -> anyhow::Result<Self> {
        let parts: Vec<&str> = arg.split(':').collect();
        let [period, idle, phase] = parts[..] else {
            bail!(
                "idle source 'cycle:{arg}' needs three numbers of seconds: cycle:PERIOD:IDLE:PHASE"
            );
        };
        let number = |what: &str, s: &str| -> anyhow::Result<f64> {
            s.trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite())
                .with_context(|| {
                    format!("idle source 'cycle:{arg}': {what} '{s}' is not a number of seconds")
                })
        };
        let (period, idle, phase) = (
            number("PERIOD", period)?,
            number("IDLE", idle)?,
            number("PHASE", phase)?,
        );
        ensure!(
            idle > 0.0 && idle <= period,
            "idle source 'cycle:{arg}': need 0 < IDLE <= PERIOD, \
             got IDLE {idle} and PERIOD {period}"
        );
        Ok(Self {
            started,
            period,
            idle,
            phase,
        })
    }
}

/// Where a cycle stands `elapsed` seconds after it started: `Ok(seconds until the idle span ends)`
/// or `Err(seconds until the next idle span starts)`.
pub(super) fn cycle_position(elapsed: f64, period: f64, idle: f64, phase: f64) -> Result<f64, f64> {
    let at = (elapsed + phase).rem_euclid(period);
    if at < idle {
        Ok(idle - at)
    } else {
        Err(period - at)
    }
}

impl IdleSource for Cycle {
    fn name(&self) -> &str {
        "cycle"
    }
    fn check(&mut self) -> Verdict {
        let elapsed = self.started.elapsed().as_secs_f64();
        match cycle_position(elapsed, self.period, self.idle, self.phase) {
            Ok(left) => Verdict::Idle {
                until: Duration::try_from_secs_f64(left)
                    .ok()
                    .and_then(|left| SystemTime::now().checked_add(left)),
            },
            Err(wait) => {
                Verdict::Busy(format!("busy part of the cycle; idle again in {wait:.1} s"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_is_idle_for_the_first_part_of_each_period_shifted_by_phase() {
        // Period 10 s, idle 4 s, phase 0.
        assert_eq!(cycle_position(0.0, 10.0, 4.0, 0.0), Ok(4.0));
        assert_eq!(cycle_position(3.0, 10.0, 4.0, 0.0), Ok(1.0));
        assert_eq!(cycle_position(4.0, 10.0, 4.0, 0.0), Err(6.0));
        assert_eq!(cycle_position(23.0, 10.0, 4.0, 0.0), Ok(1.0));
        // Phase 7 s: 0 s in is 7 s into the cycle (busy), 4 s in is 11 s (idle for 3 s more).
        assert_eq!(cycle_position(0.0, 10.0, 4.0, 7.0), Err(3.0));
        assert_eq!(cycle_position(4.0, 10.0, 4.0, 7.0), Ok(3.0));
        // A fresh source with phase 0 is idle now and says until when.
        let mut cycle = parse_spec("cycle:60:30:0").unwrap();
        let Verdict::Idle { until: Some(until) } = cycle.check() else {
            panic!("fresh cycle should be idle")
        };
        let left = until.duration_since(SystemTime::now()).unwrap();
        assert!(
            left > Duration::from_secs(29) && left <= Duration::from_secs(30),
            "{left:?}"
        );
        assert!(matches!(
            parse_spec("cycle:60:30:45").unwrap().check(),
            Verdict::Busy(_)
        ));
    }

    #[test]
    fn rejects_bad_cycles() {
        for (spec, expected) in [
            ("cycle:10:0:0", "0 < IDLE <= PERIOD"),
            ("cycle:10:11:0", "0 < IDLE <= PERIOD"),
            ("cycle:10:5", "three numbers"),
            ("cycle:ten:5:0", "PERIOD 'ten'"),
            ("cycle:10:5:inf", "PHASE 'inf'"),
        ] {
            let err = format!("{:#}", parse_spec(spec).err().unwrap());
            assert!(
                err.contains(expected),
                "'{spec}': error '{err}' lacks '{expected}'"
            );
        }
    }

    #[test]
    fn file_source_follows_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idle");
        let mut source = parse_spec(&format!("file:{}", path.display())).unwrap();
        let Verdict::Busy(why) = source.check() else {
            panic!("missing file should be busy")
        };
        assert!(
            why.contains(&path.display().to_string()) && why.contains("does not exist"),
            "{why}"
        );
        std::fs::write(&path, " idle \n").unwrap();
        assert_eq!(source.check(), Verdict::Idle { until: None });
        std::fs::write(&path, "idle\nuntil=1700000000\n").unwrap();
        assert_eq!(
            source.check(),
            Verdict::Idle {
                until: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            }
        );
        std::fs::write(&path, "busy\n").unwrap();
        assert!(matches!(source.check(), Verdict::Busy(why) if why.contains("says 'busy'")));
        std::fs::write(&path, "idle\nuntil=soon\n").unwrap();
        assert!(
            matches!(source.check(), Verdict::Busy(why) if why.contains("until=<unix seconds>"))
        );
        assert!(matches!(file_verdict("f", ""), Verdict::Busy(why) if why == "f is empty"));
    }
}
