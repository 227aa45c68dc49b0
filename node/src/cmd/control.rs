//! `nightshift pause`, `resume` and `status`: a running node's control endpoint.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ControlArgs {
    /// The running node's data directory.
    #[arg(long, default_value = "nightshift-data")]
    pub data_dir: PathBuf,
}

/// Sends `command` to the node of `a.data_dir` and prints its answer.
///
/// # Errors
/// When no node answers there.
pub async fn control_command(a: &ControlArgs, command: &str) -> anyhow::Result<()> {
    let v = crate::control::call(&a.data_dir, command).await?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
