//! `nightshift-hostile`: a hostile swarm peer for the trust tests, run as its own process.
//!
//! A plain rust-libp2p peer (the `nightshift_tests::probe` behaviours: identify, ping, Kademlia,
//! request-response with nightshift's frame codec, over TCP, optional pnet, noise and yamux) that
//! speaks the wire format itself. It dials the bootstrap, finds the trainers with Kademlia
//! FIND_NODE, connects to them, asks every connected peer for its signed status about once a
//! second (so it knows the honest round R and its hash), and attacks in one of these modes:
//!
//! - `forge`: announces a fabricated state (zero θ and momentum, formed by its own key) of round
//!   R+1 and, alternately, R+5, signed with its own key; serves it in chunks, and serves a
//!   contribution of its own (a large constant delta) to whoever replays the round, so that the
//!   replay fails. `relabel`: the same with the genesis state relabelled as round R+5.
//! - `replay`: fetches the honest nodes' contributions of the round under way, waits until the
//!   swarm is two rounds further, and pushes them again, repeatedly.
//! - `garbage`: malformed frames through a second, outbound-only request-response behaviour on
//!   the swarm's protocol with a raw codec (a length prefix claiming ~4 GB, a 10 MB claim for a
//!   small kind, random bytes, truncated frames), and well-formed pushes carrying a random
//!   payload under a bad signature.
//! - `flood`: as many concurrent state-chunk and status requests as the transport takes, and
//!   large signed pushes for a wrong round.
//!
//! At the end (`--secs`, or SIGTERM) it writes a JSON report (`--report`) and exits 0. Nothing a
//! node sends makes it panic: every answer is matched, never unwrapped.

mod args;
mod events;
mod flood;
mod forge;
mod garbage;
mod net;
mod peers;
mod replay;
mod run;

use ed25519_dalek::SigningKey;
use libp2p::request_response::OutboundRequestId;
use libp2p::{Multiaddr, PeerId};
use nightshift_protocol::{
    ContributionId, Hash32, SignedEnvelope, SignedManifest, StateSnapshot, Status, StatusLists,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use args::{Mode, parse_args};
use run::run;

const USAGE: &str = "usage: nightshift-hostile --manifest FILE --bootstrap MULTIADDR \
[--key KEYFILE] [--swarm-key FILE] --mode forge|relabel|replay|garbage|flood [--secs N] [--report FILE]";

/// Most bytes read of an answer to a raw (garbage) request.
const RAW_RESPONSE_BOUND: u64 = 64 << 10;
/// Requests kept in flight per trainer while flooding: small ones and pushes.
const FLOOD_SMALL_INFLIGHT: usize = 48;
const FLOOD_PUSH_INFLIGHT: usize = 2;
/// Most contributions captured for the replay attack.
const MAX_CAPTURED: usize = 32;
/// Size of the random payload of the oversized pushes.
const BIG_PAYLOAD: usize = 2 << 20;

/// A small, fast, non-cryptographic generator for junk bytes.
struct Junk(u64);

impl Junk {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// Sent, answered and failed requests of one kind.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    sent: u64,
    answered: u64,
    failed: u64,
}

/// What an outbound request was for.
#[derive(Clone, Copy, Debug)]
enum Purpose {
    Status,
    Capture(u64, [u8; 32]),
    Flood { push: bool },
    Other,
}

struct Pending {
    peer: PeerId,
    kind: &'static str,
    purpose: Purpose,
}

/// A state this peer made up, and its encoding served in chunks.
struct Forged {
    round: u64,
    hash: Hash32,
    encoded: Arc<Vec<u8>>,
    formed_by: Vec<ContributionId>,
}

struct Run {
    mode: Mode,
    manifest: SignedManifest,
    swarm_id: Hash32,
    key: SigningKey,
    me: [u8; 32],
    local: PeerId,
    boot: Option<PeerId>,
    boot_addr: Multiaddr,
    num_params: usize,
    /// The frame bound the nodes apply (as `nightshift run` computes it).
    node_max_frame: usize,
    genesis: Arc<StateSnapshot>,
    junk: Junk,
    // Peers.
    connected: HashSet<PeerId>,
    ever_connected: HashSet<PeerId>,
    addrs: HashMap<PeerId, Vec<Multiaddr>>,
    statuses: HashMap<PeerId, Status>,
    trainers: HashSet<PeerId>,
    disconnected: u64,
    dial_failures: u64,
    statuses_opened: u64,
    statuses_refused: u64,
    /// Highest round a trainer's status named, and the hashes trainers named per round.
    honest_round: Option<u64>,
    honest_hashes: BTreeMap<u64, Hash32>,
    // Requests.
    pending: HashMap<OutboundRequestId, Pending>,
    raw_pending: HashMap<OutboundRequestId, (PeerId, &'static str)>,
    tally: BTreeMap<&'static str, Tally>,
    refused_answers: u64,
    raw_closed: u64,
    raw_answered: u64,
    inbound: BTreeMap<&'static str, u64>,
    inbound_failures: u64,
    // Forge.
    forged: HashMap<Hash32, Forged>,
    forged_log: Vec<(u64, Hash32)>,
    /// The forged status announced last (re-signed with a fresh time stamp when asked for).
    current: Option<(Status, StatusLists)>,
    flip: bool,
    announced: u64,
    contributions_served: u64,
    state_chunks_served: u64,
    // Replay.
    captured: BTreeMap<(u64, [u8; 32]), SignedEnvelope>,
    asked: HashSet<(u64, [u8; 32])>,
    replays_pushed: u64,
    // Flood and garbage.
    flood_inflight: HashMap<PeerId, (usize, usize)>,
    big_push: Option<SignedEnvelope>,
    fitting_push: Option<SignedEnvelope>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let report_path = args.report.clone();
    match run(args).await {
        Ok(report) => {
            let text = serde_json::to_string_pretty(&report).unwrap_or_default();
            println!("{text}");
            if let Some(p) = report_path
                && let Err(e) = std::fs::write(&p, text + "\n")
            {
                eprintln!("cannot write {}: {e}", p.display());
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("nightshift-hostile: {e}");
            std::process::exit(1);
        }
    }
}
