//! The nightshift daemon: libp2p networking, DiLoCo rounds, sled storage, and the CLI's commands.
//!
//! # Layout
//! - [`net`] — the swarm-owning event loop, its handle, and the wire codec.
//! - [`round`] — the trainer: rounds, collection, reconciliation, outer step ([`round::accept`]
//!   holds the pure rules: acceptance, aggregation, canonical state).
//! - [`bootstrap_node`] — the node others dial first.
//! - [`store`] — sled: identity, manifest, checkpoints.
//! - [`events`] — JSON-lines events for tools and tests.
//! - [`plot`] — small SVG line charts.
//! - [`demo`] — `nightshift demo`: a local swarm of processes, its table, report and plot.
//! - [`bench`] — `nightshift bench convergence`: DiLoCo against baselines, in one process.
//! - [`cli`] — the command-line interface.

pub mod bench;
pub mod bootstrap_node;
pub mod cli;
pub mod demo;
pub mod events;
pub mod net;
pub mod plot;
pub mod round;
pub mod store;
