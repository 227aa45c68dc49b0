//! `nightshift doctor`: whether this machine can take part, and if not, why. It looks at the
//! devices (CUDA, NVML, memory), the idle sources, the data directory, the listen port, the
//! network's reachability and the clock against peers, and says for each what to do.

use clap::Args;
use libp2p::Multiaddr;
use serde::Serialize;
use std::path::PathBuf;

mod checks;
mod probe;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The node's data directory: a node running there is asked directly; otherwise its store
    /// is checked, and its key and swarm (stored by an earlier `run`) are used for the probe.
    #[arg(long, default_value = "nightshift-data")]
    pub data_dir: PathBuf,
    /// Bootstrap address(es) to probe reachability through, when no node runs in --data-dir.
    #[arg(long)]
    pub bootstrap: Vec<Multiaddr>,
    /// The swarm manifest (default: the one stored in --data-dir).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Identity key file (default: the one stored in --data-dir); a swarm with an allowlist
    /// admits its members' keys only.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The swarm's pre-shared key, for a swarm created with --private. Default: `swarm.key`
    /// beside --manifest.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    /// The address your node listens on (`run --listen`): its port is checked, and the probe
    /// runs from it, so that the verdict is about that port.
    #[arg(long, default_value = "/ip4/0.0.0.0/tcp/0")]
    pub listen: Multiaddr,
    /// The swarm's data file or directory, as given to `run --data`.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The swarm's `tokenizer.json`, as given to `run --tokenizer`.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The idle sources to ask, as given to `run --idle` (repeatable).
    #[arg(long = "idle", default_value = "auto")]
    pub idle: Vec<String>,
    /// Longest wait for a peer to try dialling this machine back, in seconds.
    #[arg(long, default_value_t = 45.0)]
    pub wait: f64,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How a finding bears on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Works.
    Ok,
    /// Worth knowing; nothing to fix.
    Info,
    /// Works, but not as well as it could.
    Warn,
    /// Keeps the node from training.
    Fail,
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub section: &'static str,
    pub level: Level,
    pub what: String,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub todo: Option<String>,
}

impl Finding {
    fn new(section: &'static str, level: Level, what: impl Into<String>) -> Self {
        Finding {
            section,
            level,
            what: what.into(),
            todo: None,
        }
    }

    fn todo(mut self, todo: impl Into<String>) -> Self {
        self.todo = Some(todo.into());
        self
    }
}

/// Runs `nightshift doctor`.
///
/// # Errors
/// Bad arguments, or a manifest or key that the probe cannot read.
pub async fn run_doctor(a: DoctorArgs) -> anyhow::Result<()> {
    if !(1.0..=600.0).contains(&a.wait) {
        anyhow::bail!("--wait must be between 1 and 600 seconds");
    }
    let running = crate::control::call(&a.data_dir, "status").await.ok();
    let mut findings = checks::device();
    findings.extend(checks::idle(&a.idle));
    findings.extend(checks::data_dir(&a, running.as_ref()));
    findings.extend(checks::port(&a.listen, running.is_some()));
    let (source, reach) = match &running {
        Some(v) => match serde_json::from_value(v["network"].clone()) {
            Ok(r) => (
                Some(format!("the node running in {}", a.data_dir.display())),
                Some(r),
            ),
            Err(_) => (None, None),
        },
        None if a.bootstrap.is_empty() => (None, None),
        None => (
            Some(format!("a probe from {}", a.listen)),
            Some(probe::probe(&a).await?),
        ),
    };
    findings.extend(checks::network(
        &a.data_dir,
        source.as_deref(),
        reach.as_ref(),
    ));
    findings.extend(checks::clock(running.as_ref()));

    if a.json {
        let device = findings
            .iter()
            .filter(|f| f.section == "device")
            .map(|f| f.what.clone())
            .collect::<Vec<_>>()
            .join("; ");
        let out = serde_json::json!({
            "source": source,
            "device": device,
            "network": reach,
            "advice": reach.as_ref().map(|r| r.explain()).unwrap_or_default(),
            "checks": findings,
            "worst": findings.iter().map(|f| f.level).max(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_report(&findings);
    Ok(())
}

fn print_report(findings: &[Finding]) {
    let mut section = "";
    for f in findings {
        if f.section != section {
            section = f.section;
            println!("{section}");
        }
        let tag = match f.level {
            Level::Ok => "ok  ",
            Level::Info => "info",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        println!("  {tag}  {}", f.what);
        if let Some(todo) = &f.todo {
            println!("        → {todo}");
        }
    }
    let fails = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warns = findings.iter().filter(|f| f.level == Level::Warn).count();
    println!();
    match (fails, warns) {
        (0, 0) => println!("nothing keeps this node from training"),
        (0, w) => println!("{w} warning(s); nothing keeps this node from training"),
        (f, _) => println!("{f} problem(s) keep this node from training: see FAIL above"),
    }
}
