//! The node's HTTP endpoint (`nightshift run --http ADDR`): a live dashboard at `/` (the
//! validation-loss curve, the rounds, the peers, yields and refusals), the node's events as
//! server-sent events at `/events`, its status as JSON at `/status`, and Prometheus metrics at
//! `/metrics`. The page and its script are in the binary; nothing is fetched from elsewhere.
//! The node writes the address it got to `<data-dir>/http.addr`.

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use futures::Stream;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::sync::broadcast::error::RecvError;
use tracing::{info, warn};

use crate::events::EventFeed;
use crate::metrics::NodeMetrics;

/// The file in the data directory that holds the HTTP address.
pub const HTTP_FILE: &str = "http.addr";

const PAGE: &str = include_str!("dashboard.html");

/// Where a node in `data_dir` keeps its HTTP address.
pub fn http_file(data_dir: &Path) -> PathBuf {
    data_dir.join(HTTP_FILE)
}

/// What the endpoint serves from.
#[derive(Clone)]
pub struct Observed {
    pub metrics: Arc<NodeMetrics>,
    pub feed: Arc<EventFeed>,
    /// The status `nightshift status` shows.
    pub info: Arc<RwLock<serde_json::Value>>,
}

/// Binds `addr`, writes the bound address to `<data_dir>/http.addr` and serves until the
/// process ends.
///
/// # Errors
/// A bind failure or an unwritable data directory.
pub async fn serve(
    addr: SocketAddr,
    data_dir: &Path,
    what: Observed,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind the HTTP endpoint to {addr}"))?;
    let bound = listener.local_addr()?;
    if !bound.ip().is_loopback() {
        warn!(address = %bound, "the dashboard and metrics are reachable from other machines");
    }
    crate::control::write_address(&http_file(data_dir), bound)?;
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/events", get(events))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .with_state(what);
    info!(address = %bound, "dashboard at http://{bound}/ (Prometheus metrics at /metrics)");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "the HTTP endpoint stopped");
        }
    });
    Ok(bound)
}

async fn metrics(State(o): State<Observed>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        o.metrics.render(),
    )
}

async fn status(State(o): State<Observed>) -> impl IntoResponse {
    let v = o.info.read().map(|v| v.clone()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], v.to_string())
}

/// Every event so far, then each new one as it happens.
async fn events(State(o): State<Observed>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (past, rx) = o.feed.subscribe();
    let past = futures::stream::iter(past.into_iter().map(|l| Ok(Event::default().data(l))));
    let live = futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(l) => return Some((Ok(Event::default().data(l)), rx)),
                // A reader too slow for the feed skips what it missed.
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(futures::StreamExt::chain(past, live)).keep_alive(KeepAlive::default())
}
