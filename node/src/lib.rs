//! The `nightshift` command line: one module per command with its arguments ([`cmd`]; `cmd::demo`:
//! a local swarm of processes, its table, report and plot; `cmd::peers`: the swarm's nodes and
//! their advertised windows; ...), over the daemon (`nightshift-daemon`, re-exported here) and
//! the bootstrap node and swarm creation (`nightshift-bootstrap`).
//!
//! The benchmarks and experiments live in the `nightshift-lab` crate and binary (`lab/`).

pub mod cmd;

pub use nightshift_daemon::{
    control, events, http, idle, machine, metrics, net, plot, round, store,
};
