//! The nightshift daemon: libp2p networking, the round's rules and the driver that runs them over
//! libp2p, sled and burn, idle windows, and what a running node reports.
//!
//! # Layout
//! - [`net`] — the swarm-owning event loop, its handle, and the wire codec.
//! - [`machine`] — the round's rules as a pure state machine (no I/O, no clock): acceptance,
//!   aggregation, verification by replay, the stages of a round; the simulator runs it.
//! - [`round`] — the trainer: the driver that runs the machine over libp2p, sled and burn (and
//!   the network side the bootstrap node shares).
//! - [`store`] — sled: identity, manifest, checkpoints (pruned), resumable state downloads.
//! - [`idle`] — idle detection: sources (NVML, schedule, CPU load, files, cycles, manual) and a
//!   monitor with hysteresis.
//! - [`control`] — the loopback control endpoint behind `nightshift pause/resume/status`.
//! - [`events`] — JSON-lines events for tools and tests.
//! - [`metrics`] and [`http`] — Prometheus metrics, served over HTTP (`run --http`).
//! - [`plot`] — small SVG line charts.
//!
//! The bootstrap node and swarm creation are in `nightshift-bootstrap`, the command line in
//! `nightshift-node`, the benchmarks in `nightshift-lab`.

pub mod control;
pub mod events;
pub mod http;
pub mod idle;
pub mod machine;
pub mod metrics;
pub mod net;
pub mod plot;
pub mod round;
pub mod store;
