//! Command-line arguments and the attack modes.

use libp2p::Multiaddr;
use std::path::PathBuf;

use crate::USAGE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Forge,
    Relabel,
    Replay,
    Garbage,
    Flood,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "forge" => Mode::Forge,
            "relabel" => Mode::Relabel,
            "replay" => Mode::Replay,
            "garbage" => Mode::Garbage,
            "flood" => Mode::Flood,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Forge => "forge",
            Mode::Relabel => "relabel",
            Mode::Replay => "replay",
            Mode::Garbage => "garbage",
            Mode::Flood => "flood",
        }
    }

    pub(crate) fn forges(self) -> bool {
        matches!(self, Mode::Forge | Mode::Relabel)
    }
}

pub(crate) struct Args {
    pub(crate) manifest: PathBuf,
    pub(crate) bootstrap: Multiaddr,
    pub(crate) key: Option<PathBuf>,
    pub(crate) swarm_key: Option<PathBuf>,
    pub(crate) mode: Mode,
    pub(crate) secs: u64,
    pub(crate) report: Option<PathBuf>,
}

pub(crate) fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut manifest, mut bootstrap, mut key, mut swarm_key, mut mode, mut report) =
        (None, None, None, None, None, None);
    let mut secs = 30;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--manifest" => manifest = Some(PathBuf::from(value()?)),
            "--bootstrap" => {
                let v = value()?;
                bootstrap = Some(v.parse().map_err(|e| format!("--bootstrap {v}: {e}"))?);
            }
            "--key" => key = Some(PathBuf::from(value()?)),
            "--swarm-key" => swarm_key = Some(PathBuf::from(value()?)),
            "--mode" => {
                let v = value()?;
                mode = Some(Mode::parse(&v).ok_or_else(|| format!("unknown mode {v}"))?);
            }
            "--secs" => {
                let v = value()?;
                secs = v.parse().map_err(|e| format!("--secs {v}: {e}"))?;
            }
            "--report" => report = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        manifest: manifest.ok_or("--manifest is required")?,
        bootstrap: bootstrap.ok_or("--bootstrap is required")?,
        key,
        swarm_key,
        mode: mode.ok_or("--mode is required")?,
        secs,
        report,
    })
}
