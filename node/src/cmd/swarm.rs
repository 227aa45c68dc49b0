//! `nightshift swarm init`: a new swarm's signed manifest, and the keys it needs (created by
//! `nightshift_bootstrap::swarm`).

use clap::{Args, Subcommand};
use nightshift_bootstrap::SwarmSettings;
use nightshift_bootstrap::swarm::{NewSwarm, create};
use nightshift_protocol::slices::Averaging;
use nightshift_protocol::{Aggregator, DeltaCodec, InnerOptimizer};
use std::path::PathBuf;

use super::common::{parse_public_key, unix_now};

#[derive(Subcommand, Debug)]
pub enum SwarmCommand {
    /// Write a signed swarm manifest.
    Init(InitArgs),
}

/// Settings of a new swarm. The defaults are [`SwarmSettings::default`]'s; why each default
/// was chosen is in docs/DESIGN-NOTES.md ("Why the defaults").
#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct SwarmFlags {
    /// Model preset: tiny, small, medium or large.
    #[arg(long, default_value = "small")]
    pub preset: String,
    /// Training data: a UTF-8 text file, a JSON-lines file (`.jsonl`, a `text` field per
    /// line), or a directory of them (`*.txt`, `*.md`, `*.jsonl`, read in name order). Every file
    /// is pinned by its hash; nodes stream it in shards. Default: the embedded Shakespeare.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A Hugging Face `tokenizer.json` (BPE and the like), pinned by its hash; nodes need the same
    /// file. Default: the byte tokenizer (each distinct byte of the data is a token).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Size of a training shard in KiB. Default: a round's shards hold eight times the text a
    /// node trains on in a round, and at least 4 KiB each.
    #[arg(long, value_parser = clap::value_parser!(u32).range(4..=1 << 24))]
    pub shard_kib: Option<u32>,
    /// Shards each node reads per round, drawn anew every round from its key and the round.
    /// Default: one per window a node trains on in a round (inner steps × batch), at most 1024,
    /// so that its windows come from all over the dataset.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards_per_round: Option<u32>,
    /// H: inner steps each node trains per round before the contributions are averaged.
    #[arg(long, default_value_t = SwarmSettings::default().inner_steps)]
    pub inner_steps: u32,
    /// How contributions are compressed on the wire: fp32, fp16, int8[:block], int4[:block],
    /// topk[:permille] or lowrank[:rank[:block]] (weight matrices as rank-r factors in int4;
    /// suits `--inner-optimizer adamw` swarms, not Muon's full-rank updates).
    #[arg(long, default_value = "int4:64")]
    pub codec: DeltaCodec,
    /// Sequences per inner step on each node.
    #[arg(long, default_value_t = SwarmSettings::default().batch_size)]
    pub batch_size: u32,
    /// Learning rate of the inner steps (AdamW's; Muon's is a multiple of it).
    #[arg(long, default_value_t = SwarmSettings::default().inner_lr)]
    pub inner_lr: f32,
    /// Inner steps over which the rate rises linearly to `--inner-lr`, counted from the node's
    /// start.
    #[arg(long, default_value_t = SwarmSettings::default().warmup_steps)]
    pub warmup_steps: u32,
    /// Decoupled weight decay of the inner steps.
    #[arg(long, default_value_t = SwarmSettings::default().weight_decay)]
    pub weight_decay: f32,
    /// Inner optimizer: `muon[:MULT]` (Muon for the blocks' weight matrices at MULT times
    /// `--inner-lr`, with updates scaled to AdamW's RMS and the same weight decay; AdamW for the
    /// embeddings, head, biases and norms) or `adamw` (every parameter, as in the DiLoCo
    /// paper).
    #[arg(long, default_value = "muon")]
    pub inner_optimizer: InnerOptimizer,
    /// Learning rate of the outer Nesterov step applied to each round's averaged
    /// pseudo-gradient (lower it, or the momentum, for short rounds such as H = 10).
    #[arg(long, default_value_t = SwarmSettings::default().outer_lr)]
    pub outer_lr: f32,
    /// Momentum of the outer Nesterov step.
    #[arg(long, default_value_t = SwarmSettings::default().outer_momentum)]
    pub outer_momentum: f32,
    /// How each round's contributions are combined: `cclip[:CLIP[:ITERS]]` (centered clipping:
    /// each contribution's size is capped and outliers clipped, so a malicious minority moves
    /// the result by a bounded amount; as good as the mean when nobody attacks) or `mean`
    /// (token-weighted; one member can move it anywhere).
    #[arg(long, default_value = "cclip")]
    pub aggregator: Aggregator,
    /// How each round's contributions are averaged: `all-to-all` (every node sends its whole
    /// contribution to every peer; what each node sends grows with the swarm) or
    /// `reduce[:SLICES[:CODEC]]` (slice by slice through reducers inside the network: each
    /// contributor averages one slice of every contribution and a second checks it; what each
    /// node sends stays about the same as the swarm grows; SLICES 0: one per contributor, the
    /// averages sent as CODEC, `int8:64` by default).
    #[arg(long, default_value = "all-to-all")]
    pub averaging: Averaging,
    /// Seconds a node waits for the others after its contribution is out.
    #[arg(long, default_value_t = SwarmSettings::default().round_deadline_secs)]
    pub deadline_secs: u32,
    /// Seed of the model's initial weights (in `demo`, also of its nodes' keys).
    #[arg(long, default_value_t = SwarmSettings::default().init_seed)]
    pub seed: u64,
}

impl SwarmFlags {
    /// The genesis settings these flags describe.
    pub fn settings(&self, name: &str, allowlist: Vec<[u8; 32]>) -> SwarmSettings {
        SwarmSettings {
            name: name.into(),
            preset: self.preset.clone(),
            data: self.data.clone(),
            tokenizer: self.tokenizer.clone(),
            shard_bytes: self.shard_kib.map(|k| u64::from(k) << 10),
            shards_per_round: self.shards_per_round,
            inner_steps: self.inner_steps,
            batch_size: self.batch_size,
            inner_lr: self.inner_lr,
            warmup_steps: self.warmup_steps,
            weight_decay: self.weight_decay,
            inner_optimizer: self.inner_optimizer,
            outer_lr: self.outer_lr,
            outer_momentum: self.outer_momentum,
            codec: self.codec,
            round_deadline_secs: self.deadline_secs,
            aggregator: self.aggregator,
            averaging: self.averaging,
            init_seed: self.seed,
            allowlist,
            ..SwarmSettings::default()
        }
    }
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Where to write the manifest (JSON).
    #[arg(long, short, default_value = "manifest.json")]
    pub out: PathBuf,
    /// The creator's key; a new one is written beside the manifest when absent.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The swarm's name, shown to those who join it.
    #[arg(long, default_value = "nightshift")]
    pub name: String,
    /// Only these keys may contribute (key files or 64-hex public keys); repeatable. Nodes of
    /// such a swarm refuse connections from any other key (but the bootstrap nodes').
    #[arg(long = "allow")]
    pub allow: Vec<String>,
    /// Also close the swarm at the transport: write a pre-shared key (`swarm.key`, the standard
    /// libp2p format) beside the manifest; every node needs it to connect at all (libp2p pnet,
    /// TCP only). Needs --allow.
    #[arg(long)]
    pub private: bool,
    /// Bootstrap node keys (key files or 64-hex public keys); repeatable. Default: a new key
    /// written beside the manifest (`<manifest>.bootstrap.key.json`), which `nightshift
    /// bootstrap --manifest` picks up.
    #[arg(long = "bootstrap-key")]
    pub bootstrap_keys: Vec<String>,
    /// With --allow: how many members must attest a state before a node too far behind to
    /// replay it adopts it (a bootstrap's attestation always suffices). Default: one more than
    /// the malicious members tolerated, ⌊(members − 1)/3⌋ + 1.
    #[arg(long)]
    pub attest_quorum: Option<u32>,
    #[command(flatten)]
    pub swarm: SwarmFlags,
}

/// Runs `swarm init`.
///
/// # Errors
/// A refused setting or key, or a file that cannot be written (nothing is left behind then).
pub fn init(a: InitArgs) -> anyhow::Result<()> {
    let allow = a
        .allow
        .iter()
        .map(|s| parse_public_key(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bootstrap_keys = a
        .bootstrap_keys
        .iter()
        .map(|s| parse_public_key(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let created = create(NewSwarm {
        out: a.out.clone(),
        creator_key: a.key.clone(),
        settings: SwarmSettings {
            attest_quorum: a.attest_quorum,
            ..a.swarm.settings(&a.name, allow)
        },
        private: a.private,
        bootstrap_keys,
        created_unix: unix_now(),
    })?;
    for (what, path) in &created.wrote {
        eprintln!("wrote {what} to {}", path.display());
    }
    let m = &created.manifest;
    println!("swarm id: {}", m.swarm_id());
    println!("manifest: {}", a.out.display());
    println!("aggregator: {}", m.manifest.aggregator);
    println!("averaging: {}", m.manifest.training.averaging);
    Ok(())
}
