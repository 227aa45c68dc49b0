//! A private swarm of real `nightshift` processes on 127.0.0.1, as the lab's process benchmarks
//! (`churn`, `scale`) set it up: node keys, a bootstrap key and the signed manifest in one
//! directory, then node processes with their threads.

use anyhow::Context;
use nightshift_bootstrap::SwarmSettings;
use std::path::{Path, PathBuf};
use tokio::process::Child;

use nightshift_node::cmd::demo::{new_bootstrap_key, nightshift_exe};

/// The swarm written in `dir`: node `i`'s key in `node<i>.key.json`, the bootstrap node's key
/// beside the manifest, and the manifest signed by a fresh creator key with the settings
/// `settings` gives for the members' keys (its bootstrap key filled in).
pub struct LocalSwarm {
    pub manifest: PathBuf,
    /// The members' public keys, short (first 6 bytes, hex), in node order.
    pub short_keys: Vec<String>,
}

impl LocalSwarm {
    /// # Errors
    /// When a key or the manifest cannot be written, or the settings are refused.
    pub fn write(
        dir: &Path,
        nodes: usize,
        settings: impl FnOnce(Vec<[u8; 32]>) -> SwarmSettings,
    ) -> anyhow::Result<Self> {
        Self::write_seeded(dir, nodes, None, settings)
    }

    /// As [`LocalSwarm::write`], the node keys (which seed the batches each node samples)
    /// derived from `seed` as the demo derives them, when given; fresh random keys otherwise.
    ///
    /// # Errors
    /// As [`LocalSwarm::write`].
    pub fn write_seeded(
        dir: &Path,
        nodes: usize,
        seed: Option<u64>,
        settings: impl FnOnce(Vec<[u8; 32]>) -> SwarmSettings,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let creator = nightshift_bootstrap::generate_key()?;
        let mut allow = vec![];
        for i in 0..nodes {
            let k = match seed {
                Some(s) => nightshift_node::cmd::demo::demo_key(s, i),
                None => nightshift_bootstrap::generate_key()?,
            };
            nightshift_bootstrap::write_key(&dir.join(format!("node{i}.key.json")), &k)?;
            allow.push(k.verifying_key().to_bytes());
        }
        let short_keys = allow.iter().map(|k| hex::encode(&k[..6])).collect();
        let manifest = dir.join("manifest.json");
        let settings = SwarmSettings {
            bootstraps: vec![new_bootstrap_key(&manifest)?],
            ..settings(allow)
        };
        let signed = nightshift_bootstrap::build_manifest(&settings, &creator, 0)?;
        std::fs::write(&manifest, serde_json::to_string_pretty(&signed)?)?;
        Ok(LocalSwarm {
            manifest,
            short_keys,
        })
    }
}

/// Starts `nightshift` with `args` and RAYON_NUM_THREADS = `threads`, its output going to
/// `log`; killed when dropped.
///
/// # Errors
/// When the binary cannot be found or started, or the log cannot be created.
pub fn start_node(args: &[String], threads: usize, log: &Path) -> anyhow::Result<Child> {
    let log =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    tokio::process::Command::new(nightshift_exe()?)
        .args(args)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a node")
}

/// Waits until every node in `children` has exited, failing as soon as one exits with an error
/// or when `max_secs` pass; `progress(running)` is called every 15 s.
///
/// # Errors
/// A node that failed, or nodes still running at the deadline (`dir` holds their logs).
pub async fn wait_nodes(
    children: &mut [Child],
    max_secs: f64,
    dir: &Path,
    mut progress: impl FnMut(usize),
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(max_secs);
    let mut last_print = std::time::Instant::now();
    loop {
        let mut running = 0;
        for (i, c) in children.iter_mut().enumerate() {
            match c.try_wait()? {
                None => running += 1,
                Some(st) if !st.success() => {
                    anyhow::bail!("node {i} failed ({st}); see {}", dir.display())
                }
                Some(_) => {}
            }
        }
        if running == 0 {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "{running} nodes still ran after {max_secs} s; see {}",
                dir.display()
            );
        }
        if last_print.elapsed() > std::time::Duration::from_secs(15) {
            progress(running);
            last_print = std::time::Instant::now();
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
