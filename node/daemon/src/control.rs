//! The local control endpoint of a running node: `nightshift pause`, `resume` and `status`, and
//! the snapshot `nightshift export` and `sample` read while the node runs.
//!
//! A TCP listener bound to loopback only (a non-loopback address is refused). The node writes
//! the address it got to `<data-dir>/control.addr`; the commands read it from there. One request
//! line (`pause`, `resume`, `status` or `snapshot`, at most [`MAX_LINE`] bytes) gets one JSON line
//! back. `pause` sets the manual flag that the idle monitor's `manual` source reads, so the node
//! yields exactly as it does when its machine gets busy. `snapshot` writes the node's manifest
//! and current state to `<data-dir>/snapshot/` (its database is locked while it runs) and says
//! which state it wrote.

use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

/// The file in the data directory that holds the control address.
pub const CONTROL_FILE: &str = "control.addr";
/// Longest request line accepted.
pub const MAX_LINE: u64 = 64;
/// The directory in the data directory that `snapshot` writes.
pub const SNAPSHOT_DIR: &str = "snapshot";
/// The files a snapshot holds: the signed manifest and the state, each `wire`-encoded.
pub const SNAPSHOT_MANIFEST: &str = "manifest.bin";
pub const SNAPSHOT_STATE: &str = "state.bin";

/// What the node serves its peers, once its network is up: where `snapshot` reads the state.
pub type ServedSource = Arc<OnceLock<crate::net::ServedHandle>>;

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
    served: ServedSource,
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
    let snapshot_dir = data_dir.join(SNAPSHOT_DIR);
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let manual = manual.clone();
            let info = info.clone();
            let served = served.clone();
            let snapshot_dir = snapshot_dir.clone();
            tokio::spawn(async move {
                let node = Node {
                    manual: &manual,
                    info: &info,
                    served: &served,
                    snapshot_dir: &snapshot_dir,
                };
                if let Err(e) = handle(stream, node).await {
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

/// What the control endpoint reaches of the running node.
#[derive(Clone, Copy)]
struct Node<'a> {
    manual: &'a AtomicBool,
    info: &'a RwLock<Value>,
    served: &'a ServedSource,
    snapshot_dir: &'a Path,
}

/// Writes the manifest and current state the node serves to `dir` (each file written whole,
/// then renamed into place) and returns the state's round and hash.
fn write_snapshot(served: &ServedSource, dir: &Path) -> anyhow::Result<Value> {
    let cur = served
        .get()
        .context("the node is still starting: try again in a moment")?
        .current();
    let manifest = cur
        .manifest
        .as_ref()
        .context("the node holds no manifest yet")?;
    let (hash, bytes) = cur
        .current_state()
        .context("the node serves no state yet")?;
    let state: nightshift_protocol::StateSnapshot =
        nightshift_protocol::wire::decode(&bytes, usize::MAX).context("the served state")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let put = |name: &str, data: &[u8]| -> anyhow::Result<()> {
        let path = dir.join(name);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, data)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .with_context(|| format!("cannot write {}", path.display()))
    };
    put(
        SNAPSHOT_MANIFEST,
        &nightshift_protocol::wire::encode(&**manifest),
    )?;
    put(SNAPSHOT_STATE, &bytes)?;
    Ok(json!({"ok": true, "round": state.round, "state_hash": hash.to_hex()}))
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
            "error": format!(
                "unknown command {other:?}; expected pause, resume, status or snapshot"
            ),
        }),
    }
}

async fn handle(stream: TcpStream, node: Node<'_>) -> anyhow::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(r.take(MAX_LINE));
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
        .await
        .context("no request line")??;
    let v = if line.trim() == "snapshot" {
        // A large state takes a while to write: off the async threads.
        let (served, dir) = (node.served.clone(), node.snapshot_dir.to_path_buf());
        match tokio::task::spawn_blocking(move || write_snapshot(&served, &dir)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => json!({"ok": false, "error": format!("{e:#}")}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        }
    } else {
        answer(&line, node.manual, node.info)
    };
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
    // A snapshot writes the whole state first.
    let wait = if command == "snapshot" { 600 } else { 5 };
    tokio::time::timeout(
        Duration::from_secs(wait),
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
            ServedSource::default(),
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
        // Before its network is up a node has nothing to snapshot, and says so.
        let err = call(dir.path(), "snapshot").await.unwrap_err().to_string();
        assert!(err.contains("still starting"), "{err}");
    }

    #[tokio::test]
    async fn refuses_to_listen_beyond_loopback_and_says_when_no_node_runs() {
        let dir = tempfile::tempdir().unwrap();
        let manual = Arc::new(AtomicBool::new(false));
        let info = Arc::new(RwLock::new(json!({})));
        let e = serve(
            "0.0.0.0:0".parse().unwrap(),
            dir.path(),
            manual,
            info,
            ServedSource::default(),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("loopback"));
        let e = call(dir.path(), "status").await.unwrap_err().to_string();
        assert!(e.contains("no node runs"), "{e}");
    }
}
