//! `nightshift`: see `nightshift --help`.

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// Training allocates and frees many tensor buffers of the same few sizes every step; mimalloc
/// reuses them where the system allocator maps and faults in fresh pages (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = nightshift_node::cmd::Cli::parse();
    let filter = EnvFilter::try_from_env("NIGHTSHIFT_LOG")
        .unwrap_or_else(|_| EnvFilter::new("warn,nightshift_node=info,nightshift=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(nightshift_node::cmd::execute(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
