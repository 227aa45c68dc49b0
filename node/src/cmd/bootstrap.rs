//! `nightshift bootstrap`: the node others dial first.

use anyhow::Context;
use clap::Args;
use libp2p::Multiaddr;
use nightshift_bootstrap::read_key;
use std::path::PathBuf;

use super::common::{default_bootstrap_key, read_manifest, shutdown_signal, swarm_key};
use nightshift_bootstrap::node::{BootstrapOptions, run_bootstrap};

#[derive(Args, Debug)]
pub struct BootstrapArgs {
    #[arg(long)]
    pub manifest: PathBuf,
    /// Identity key: one of the manifest's bootstrap keys. Default: the
    /// `<manifest>.bootstrap.key.json` that `swarm init` wrote beside it.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Where the node keeps the newest state it verified.
    #[arg(long, default_value = "nightshift-bootstrap")]
    pub data_dir: PathBuf,
    /// The swarm's pre-shared key, for a swarm created with --private. Default: `swarm.key`
    /// beside the manifest.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    #[arg(long, default_value = "/ip4/0.0.0.0/tcp/4001")]
    pub listen: Multiaddr,
    /// Write the full listen address here once known.
    #[arg(long)]
    pub addr_file: Option<PathBuf>,
    /// Other bootstrap nodes to peer with.
    #[arg(long)]
    pub peer: Vec<Multiaddr>,
}

/// Runs `bootstrap` until a signal.
///
/// # Errors
/// A manifest or key that cannot be read, or a network that cannot start.
pub async fn run(a: BootstrapArgs) -> anyhow::Result<()> {
    let manifest = read_manifest(&a.manifest)?;
    let key = match &a.key {
        Some(p) => read_key(p)?,
        None => {
            let p = default_bootstrap_key(&a.manifest);
            read_key(&p).with_context(|| {
                format!(
                    "no --key given and no bootstrap key at {} (written by `swarm init`)",
                    p.display()
                )
            })?
        }
    };
    let psk = swarm_key(&manifest, a.swarm_key.as_deref(), Some(&a.manifest))?;
    run_bootstrap(BootstrapOptions {
        manifest,
        key,
        listen: a.listen,
        peers: a.peer,
        addr_file: a.addr_file,
        data_dir: a.data_dir,
        psk,
        shutdown: shutdown_signal(),
    })
    .await
}
