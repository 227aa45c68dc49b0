//! The local control endpoint of a running node: `nightshift pause`, `resume` and `status`.
//!
//! A TCP listener bound to loopback only (a non-loopback address is refused). The node writes
//! the address it got to `<data-dir>/control.addr`; the commands read it from there. One request
//! line (`pause`, `resume` or `status`, at most [`MAX_LINE`] bytes) gets one JSON line back.
//! `pause` sets the manual flag that the idle monitor's `manual` source reads, so the node yields
//! exactly as it does when its machine gets busy.

use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

/// The file in the data directory that holds the control address.
pub const CONTROL_FILE: &str = "control.addr";
/// Longest request line accepted.
pub const MAX_LINE: u64 = 64;

/// Where a node in `data_dir` keeps its control address.
pub fn control_file(data_dir: &Path) -> PathBuf {
    data_dir.join(CONTROL_FILE)
}

/// Binds `addr` (loopback only), writes the bound address to `<data_dir>/control.addr`, and
/// serves requests until the process ends.
///
/// # Errors
/// A non-loopback address, a bind failure, or an unwritable data directory.
pub async fn serve(
    addr: SocketAddr,
    data_dir: &Path,
    manual: Arc<AtomicBool>,
    info: Arc<RwLock<Value>>,
) -> anyhow::Result<SocketAddr> {
    if !addr.ip().is_loopback() {
        bail!("the control endpoint must bind to a loopback address, not {addr}");
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind the control endpoint to {addr}"))?;
    let bound = listener.local_addr()?;
    write_address(&control_file(data_dir), bound)?;
    info!(address = %bound, "control endpoint listening (nightshift pause/resume/status)");
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let manual = manual.clone();
            let info = info.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(stream, &manual, &info).await {
                    debug!(%peer, error = %e, "control request failed");
                }
            });
        }
    });
    Ok(bound)
}

/// Writes `bound` to `file` atomically (a reader sees the old content or the new, never half).
pub(crate) fn write_address(file: &Path, bound: SocketAddr) -> anyhow::Result<()> {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("{bound}\n"))
        .and_then(|_| std::fs::rename(&tmp, file))
        .with_context(|| format!("cannot write {}", file.display()))
}

fn answer(line: &str, manual: &AtomicBool, info: &RwLock<Value>) -> Value {
    let status = |ok: bool| {
        let mut v = info.read().map(|v| v.clone()).unwrap_or(Value::Null);
        if !v.is_object() {
            v = json!({});
        }
        v["ok"] = json!(ok);
        v["paused_by_owner"] = json!(manual.load(Ordering::SeqCst));
        v
    };
    match line.trim() {
        "pause" => {
            manual.store(true, Ordering::SeqCst);
            info!("paused by the owner");
            status(true)
        }
        "resume" => {
            manual.store(false, Ordering::SeqCst);
            info!("resumed by the owner");
            status(true)
        }
        "status" => status(true),
        other => json!({
            "ok": false,
            "error": format!("unknown command {other:?}; expected pause, resume or status"),
        }),
    }
}

async fn handle(
    stream: TcpStream,
    manual: &AtomicBool,
    info: &RwLock<Value>,
) -> anyhow::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(r.take(MAX_LINE));
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
        .await
        .context("no request line")??;
    let v = answer(&line, manual, info);
    w.write_all(format!("{v}\n").as_bytes()).await?;
    Ok(())
}

/// Sends `command` to the node whose data directory is `data_dir` and returns its answer.
///
/// # Errors
/// When no node runs there (no control file, or nobody listening) or it answers garbage.
pub async fn call(data_dir: &Path, command: &str) -> anyhow::Result<Value> {
    let file = control_file(data_dir);
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "no node runs with --data-dir {} (cannot read {})",
            data_dir.display(),
            file.display()
        )
    })?;
    let addr: SocketAddr = text
        .trim()
        .parse()
        .with_context(|| format!("{} does not hold an address", file.display()))?;
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .context("the node does not answer")?
        .with_context(|| format!("the node is not running (nothing listens on {addr})"))?;
    stream.write_all(format!("{command}\n").as_bytes()).await?;
    let mut reply = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(stream.take(1 << 20)).read_line(&mut reply),
    )
    .await
    .context("the node did not answer in time")??;
    let v: Value = serde_json::from_str(reply.trim()).context("the node's answer is not JSON")?;
    if v["ok"] != json!(true) {
        bail!(
            "{}",
            v["error"]
                .as_str()
                .unwrap_or("the node refused the command")
        );
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pause_and_resume_flip_the_manual_flag_over_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let manual = Arc::new(AtomicBool::new(false));
        let info = Arc::new(RwLock::new(json!({"round": 3})));
        serve(
            "127.0.0.1:0".parse().unwrap(),
            dir.path(),
            manual.clone(),
            info,
        )
        .await
        .unwrap();
        let v = call(dir.path(), "pause").await.unwrap();
        assert!(manual.load(Ordering::SeqCst));
        assert_eq!(v["paused_by_owner"], json!(true));
        assert_eq!(v["round"], json!(3));
        call(dir.path(), "resume").await.unwrap();
        assert!(!manual.load(Ordering::SeqCst));
        let err = call(dir.path(), "reboot").await.unwrap_err().to_string();
        assert!(err.contains("unknown command"), "{err}");
    }

    #[tokio::test]
    async fn refuses_to_listen_beyond_loopback_and_says_when_no_node_runs() {
        let dir = tempfile::tempdir().unwrap();
        let manual = Arc::new(AtomicBool::new(false));
        let info = Arc::new(RwLock::new(json!({})));
        let e = serve("0.0.0.0:0".parse().unwrap(), dir.path(), manual, info)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("loopback"));
        let e = call(dir.path(), "status").await.unwrap_err().to_string();
        assert!(e.contains("no node runs"), "{e}");
    }
}
