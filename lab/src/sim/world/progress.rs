//! The simulator's progress line: where a long simulation is, every [`PROGRESS_SECS`] of wall
//! time.

use super::World;
use nightshift_node::machine::RoundMachine;

impl World {
    /// Rounds the nodes with a machine are on: the lowest, the median and the highest.
    fn round_spread(&self) -> Option<(u64, u64, u64)> {
        let mut rounds: Vec<u64> = self
            .nodes
            .iter()
            .filter(|n| !n.bootstrap)
            .filter_map(|n| n.machine.as_ref().map(RoundMachine::round))
            .collect();
        rounds.sort_unstable();
        Some((*rounds.first()?, rounds[rounds.len() / 2], *rounds.last()?))
    }
}

/// A line on stderr every [`PROGRESS_SECS`] of wall time while a simulation runs, so a large one
/// shows where it is (rounds, events waiting, memory) instead of running silent for an hour.
pub(super) struct Progress {
    started: std::time::Instant,
    last: std::time::Instant,
    events: u64,
}

const PROGRESS_SECS: u64 = 30;

impl Progress {
    pub(super) fn new() -> Self {
        let now = std::time::Instant::now();
        Self {
            started: now,
            last: now,
            events: 0,
        }
    }

    pub(super) fn tick(&mut self, world: &World) {
        self.events += 1;
        // Reading the clock costs little, but not nothing: look every 64K events.
        if !self.events.is_multiple_of(1 << 16)
            || self.last.elapsed() < std::time::Duration::from_secs(PROGRESS_SECS)
        {
            return;
        }
        self.last = std::time::Instant::now();
        let (low, median, high) = world.round_spread().unwrap_or_default();
        eprintln!(
            "sim: {:.0} virtual s after {:.0} s wall: rounds {low}..{high} (median {median}), \
             {} of {} finished, {} events waiting, {} handled{}",
            world.now as f64 / 1000.0,
            self.started.elapsed().as_secs_f64(),
            world.finished(),
            world.args.nodes,
            world.queue.len(),
            self.events,
            resident_mb().map_or(String::new(), |mb| format!(", {mb} MB resident")),
        );
    }
}

/// This process's resident memory, where the system says (Linux's /proc).
fn resident_mb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}
