//! The nightshift daemon: libp2p networking, DiLoCo rounds, sled storage, and the CLI's commands.
//!
//! # Layout
//! - [`net`] — the swarm-owning event loop, its handle, and the wire codec.
//! - [`machine`] — the round's rules as a pure state machine (no I/O, no clock): acceptance,
//!   aggregation, verification by replay, the stages of a round; the simulator runs it.
//! - [`round`] — the trainer: the driver that runs the machine over libp2p, sled and burn (and
//!   the network side the bootstrap node shares).
//! - [`bootstrap_node`] — the node others dial first.
//! - [`store`] — sled: identity, manifest, checkpoints (pruned), resumable state downloads.
//! - [`idle`] — idle detection: sources (NVML, schedule, CPU load, files, cycles, manual) and a
//!   monitor with hysteresis.
//! - [`control`] — the loopback control endpoint behind `nightshift pause/resume/status`.
//! - [`events`] — JSON-lines events for tools and tests.
//! - [`plot`] — small SVG line charts.
//! - [`cmd`] — the command-line interface, one module per command with its arguments
//!   (`cmd::demo`: a local swarm of processes, its table, report and plot; `cmd::peers`: the
//!   swarm's nodes and their advertised windows; ...).
//!
//! The benchmarks and experiments live in the `nightshift-lab` crate and binary (`lab/`).

pub mod bootstrap_node;
pub mod cmd;
pub mod control;
pub mod events;
pub mod idle;
pub mod machine;
pub mod net;
pub mod plot;
pub mod round;
pub mod store;
