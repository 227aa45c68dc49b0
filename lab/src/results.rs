//! What every result file of the lab records beside its runs: the commit it ran from and the
//! full configuration (every flag, defaults included), so a number can be traced and rerun.

use serde::{Deserialize, Serialize};

/// A result file: `{"commit", "config", "runs"}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recorded<C, R> {
    pub commit: String,
    pub config: C,
    pub runs: Vec<R>,
}

impl<C: Serialize, R: Serialize> Recorded<C, R> {
    /// Writes the file, pretty-printed.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn write(&self, path: &std::path::Path) -> anyhow::Result<()> {
        use anyhow::Context;
        std::fs::write(path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The commit this binary runs from, as git tells it here (with `-dirty` for local changes).
pub fn commit_here() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{c}-dirty") } else { c }
        }
        None => "unknown".into(),
    }
}
