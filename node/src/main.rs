//! `nightshift`: see `nightshift --help`.

use clap::Parser;

/// Training allocates and frees many tensor buffers of the same few sizes every step; mimalloc
/// reuses them where the system allocator maps and faults in fresh pages (docs/bench/HISTORY.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = nightshift_node::cmd::Cli::parse();
    nightshift_node::cmd::common::run_main(
        "warn,nightshift_node=info,nightshift=info",
        nightshift_node::cmd::execute(cli),
    )
}
