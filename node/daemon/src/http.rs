//! The node's HTTP endpoint (`nightshift run --http ADDR`): `GET /metrics` in Prometheus' text
//! format. The node writes the address it got to `<data-dir>/http.addr`.

use anyhow::Context;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::{info, warn};

use crate::metrics::NodeMetrics;

/// The file in the data directory that holds the HTTP address.
pub const HTTP_FILE: &str = "http.addr";

/// Where a node in `data_dir` keeps its HTTP address.
pub fn http_file(data_dir: &Path) -> PathBuf {
    data_dir.join(HTTP_FILE)
}

/// Binds `addr`, writes the bound address to `<data_dir>/http.addr` and serves until the
/// process ends.
///
/// # Errors
/// A bind failure or an unwritable data directory.
pub async fn serve(
    addr: SocketAddr,
    data_dir: &Path,
    metrics: Arc<NodeMetrics>,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind the HTTP endpoint to {addr}"))?;
    let bound = listener.local_addr()?;
    if !bound.ip().is_loopback() {
        warn!(address = %bound, "the HTTP endpoint is reachable from other machines");
    }
    let file = http_file(data_dir);
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("{bound}\n"))
        .and_then(|_| std::fs::rename(&tmp, &file))
        .with_context(|| format!("cannot write {}", file.display()))?;
    let app = Router::new()
        .route("/metrics", get(render))
        .with_state(metrics);
    info!(address = %bound, "HTTP endpoint listening: Prometheus metrics at /metrics");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "the HTTP endpoint stopped");
        }
    });
    Ok(bound)
}

async fn render(
    axum::extract::State(m): axum::extract::State<Arc<NodeMetrics>>,
) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}
