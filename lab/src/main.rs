//! `nightshift-lab`: nightshift's benchmarks and experiments, apart from the product binary.
//!
//! - `convergence` — DiLoCo against single-worker and synchronous training at equal tokens, the
//!   DiLoCo swarms through the simulator ([`convergence`]); `report` joins the JSON of several
//!   runs.
//! - `churn` — idle windows: a churning pool of `nightshift` processes against stable swarms
//!   ([`churn`]).
//! - `byzantine` — robust aggregation under attack, in one process ([`byzantine`]).
//! - `replay` — what verifying a state by replay costs ([`replay`]).
//! - `sim` — a deterministic simulator: the daemon's round machine on every node, an in-memory
//!   network, a virtual clock ([`sim`]).
//! - `scale` — bytes and time per node per round as the swarm grows, as processes and in the
//!   simulator ([`scale`]).
//! - `links` — utilization and time to a target loss as links get slower, processes over an
//!   emulated WAN ([`links`], [`wan`]).
//!
//! Every result file records its configuration, the commit and the seed.

mod byzantine;
mod churn;
mod convergence;
mod links;
mod local;
mod replay;
mod results;
mod scale;
mod sim;
mod wan;

use clap::{Parser, Subcommand};

/// Training allocates and frees many tensor buffers of the same few sizes every step: mimalloc,
/// as in the `nightshift` binary, so that timings match the product's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// nightshift's benchmarks and experiments.
#[derive(Parser, Debug)]
#[command(name = "nightshift-lab", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// DiLoCo against single-worker and synchronous training at equal tokens.
    Convergence(convergence::ConvergenceArgs),
    /// Reads the `--json` files of earlier `convergence` runs (a grid split over several
    /// processes, say) and prints them as one table with the comparisons, optionally plotting
    /// every curve on one chart.
    Report(convergence::ReportArgs),
    /// Idle windows: a churning pool against stable swarms (time to target, yields, joins), as
    /// `nightshift` processes (found beside this executable, or at $NIGHTSHIFT_BIN).
    Churn(churn::ChurnArgs),
    /// Robust aggregation under attack: K workers of which some are malicious, every attack with
    /// the plain mean and the robust aggregator, against the honest workers alone.
    Byzantine(byzantine::ByzantineArgs),
    /// A deterministic simulation of a swarm: every node runs the daemon's round machine over
    /// an in-memory network on a virtual clock, with a stand-in model.
    Sim(sim::SimArgs),
    /// What a round costs each node as the swarm grows: bytes up and down and round time, for
    /// swarms of real `nightshift` processes and, larger, in the simulator.
    Scale(scale::ScaleArgs),
    /// How fast a swarm trains as its links get slower: real processes in network namespaces
    /// joined by an emulated WAN (1, 10, 100 Mbit/s at 50 ms, and 1 % loss), utilization and
    /// time to a target loss.
    Links(links::LinksArgs),
    /// What verifying a state by replay costs (verify, decode, aggregate, outer step, hash) at
    /// each model preset, and the size of a signed status.
    Replay(replay::ReplayArgs),
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Convergence(a) => {
            tokio::task::spawn_blocking(move || convergence::run_convergence(a)).await??;
        }
        Command::Report(a) => {
            convergence::run_report(a)?;
        }
        Command::Churn(a) => {
            churn::run_churn(a).await?;
        }
        Command::Byzantine(a) => {
            tokio::task::spawn_blocking(move || byzantine::run_byzantine(a)).await??;
        }
        Command::Sim(a) => {
            tokio::task::spawn_blocking(move || sim::run_sim(a)).await??;
        }
        Command::Scale(a) => {
            scale::run_scale(a).await?;
        }
        Command::Links(a) => {
            links::run_links(a).await?;
        }
        Command::Replay(a) => {
            tokio::task::spawn_blocking(move || replay::run_replay(a)).await??;
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nightshift_node::cmd::common::run_main(
        "warn,nightshift_node=info,nightshift_lab=info",
        execute(cli),
    )
}
