//! The command-line interface: one module per command, each with its arguments.
//!
//! Doc comments on arguments are `--help` text, written for the terminal (`[:BLOCK]`, `<DIR>`), not
//! for rustdoc.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

pub mod bootstrap;
pub mod common;
pub mod control;
pub mod demo;
pub mod doctor;
pub mod export;
pub mod keygen;
pub mod peers;
pub mod run;
pub mod swarm;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub use common::shutdown_signal;

/// nightshift: idle machines train one model together over libp2p with DiLoCo.
#[derive(Parser, Debug)]
#[command(
    name = "nightshift",
    version,
    about = "nightshift: idle machines train one model together over libp2p with DiLoCo.\n\
             Start with `nightshift demo`; when a node does not train, `nightshift doctor` says why."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start a local swarm (a bootstrap and N nodes as processes on 127.0.0.1) and train it.
    ///
    /// The nodes' keys, which seed the batches each one samples, are derived from `--seed`: the
    /// same seed on the same machine trains the same model.
    Demo(demo::DemoArgs),
    /// Swarm creation.
    #[command(subcommand)]
    Swarm(swarm::SwarmCommand),
    /// Run the node others dial first: a Kademlia server that hands out the manifest.
    Bootstrap(bootstrap::BootstrapArgs),
    /// Join a swarm and train whenever the machine is idle.
    Run(run::RunArgs),
    /// Pause a running node (it yields at the next step boundary and frees the device).
    Pause(control::ControlArgs),
    /// Let a paused node train again (once its machine is idle).
    Resume(control::ControlArgs),
    /// Show a running node's state, window and idle verdict (JSON).
    Status(control::ControlArgs),
    /// List the swarm's nodes with their advertised windows and state.
    Peers(peers::PeersArgs),
    /// Check whether this machine can take part, and if not why, with what to do: its devices
    /// (CPU, memory, NVIDIA GPUs, CUDA), the idle sources, the data directory and the swarm's
    /// data, the listen port, whether peers can reach it, and its clock against theirs.
    Doctor(doctor::DoctorArgs),
    /// Write the swarm's model, as a stopped node holds it, in Hugging Face's GPT-2 layout:
    /// safetensors weights, config.json and tokenizer.json (`transformers` loads it).
    Export(export::ExportArgs),
    /// Print text the swarm's model writes after a prompt (from a stopped node's data
    /// directory, or from an export).
    Sample(export::SampleArgs),
    /// The benchmarks moved to `nightshift-lab` (this says how to run them).
    #[command(hide = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
    /// Write a new ed25519 identity key.
    Keygen {
        /// Where to write the key (JSON).
        #[arg(long, short)]
        out: PathBuf,
    },
}

/// Runs a parsed command.
///
/// # Errors
/// Whatever the command fails with, with context for the user.
pub async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run_demo(args, shutdown_signal()).await,
        Command::Keygen { out } => keygen::keygen(&out),
        Command::Swarm(swarm::SwarmCommand::Init(a)) => swarm::init(a),
        Command::Bootstrap(a) => bootstrap::run(a).await,
        Command::Run(a) => run::run(a).await,
        Command::Pause(a) => control::control_command(&a, "pause").await,
        Command::Resume(a) => control::control_command(&a, "resume").await,
        Command::Status(a) => control::control_command(&a, "status").await,
        Command::Peers(a) => peers::run_peers(a).await,
        Command::Doctor(a) => doctor::run_doctor(a).await,
        Command::Export(a) => export::run_export(a).await,
        Command::Sample(a) => export::run_sample(a).await,
        Command::Bench { rest } => anyhow::bail!(
            "the benchmarks are not part of nightshift: run `nightshift-lab {}` (built by \
             `cargo build --release -p nightshift-lab`)",
            rest.join(" ")
        ),
    }
}
