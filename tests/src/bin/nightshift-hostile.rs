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

use ed25519_dalek::SigningKey;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use libp2p::kad;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm};
use nightshift_node::net::{libp2p_keypair, protocol_names, public_key_of, unix_ms};
use nightshift_protocol::message::{MAX_CHUNK_BYTES, Phase};
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{
    Contribution, ContributionId, Hash32, NodeRole, PayloadKind, Request, Response, SignedEnvelope,
    SignedManifest, StateChunk, StateSnapshot, Status, delta, open_status, sign_status, wire,
};
use nightshift_tests::probe::{self, Probe, ProbeEvent};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forge,
    Relabel,
    Replay,
    Garbage,
    Flood,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "forge" => Mode::Forge,
            "relabel" => Mode::Relabel,
            "replay" => Mode::Replay,
            "garbage" => Mode::Garbage,
            "flood" => Mode::Flood,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Forge => "forge",
            Mode::Relabel => "relabel",
            Mode::Replay => "replay",
            Mode::Garbage => "garbage",
            Mode::Flood => "flood",
        }
    }

    fn forges(self) -> bool {
        matches!(self, Mode::Forge | Mode::Relabel)
    }
}

struct Args {
    manifest: PathBuf,
    bootstrap: Multiaddr,
    key: Option<PathBuf>,
    swarm_key: Option<PathBuf>,
    mode: Mode,
    secs: u64,
    report: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut manifest, mut bootstrap, mut key, mut swarm_key, mut mode, mut report) =
        (None, None, None, None, None, None);
    let mut secs = 30;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--manifest" => manifest = Some(PathBuf::from(value()?)),
            "--bootstrap" => {
                let v = value()?;
                bootstrap = Some(v.parse().map_err(|e| format!("--bootstrap {v}: {e}"))?);
            }
            "--key" => key = Some(PathBuf::from(value()?)),
            "--swarm-key" => swarm_key = Some(PathBuf::from(value()?)),
            "--mode" => {
                let v = value()?;
                mode = Some(Mode::parse(&v).ok_or_else(|| format!("unknown mode {v}"))?);
            }
            "--secs" => {
                let v = value()?;
                secs = v.parse().map_err(|e| format!("--secs {v}: {e}"))?;
            }
            "--report" => report = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        manifest: manifest.ok_or("--manifest is required")?,
        bootstrap: bootstrap.ok_or("--bootstrap is required")?,
        key,
        swarm_key,
        mode: mode.ok_or("--mode is required")?,
        secs,
        report,
    })
}

/// Sends raw bytes as a request and reads whatever comes back (bounded). Outbound only.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl request_response::Codec for RawCodec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &StreamProtocol, _: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        Err(io::Error::other("the raw codec only sends"))
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut buf = Vec::new();
        (&mut *io)
            .take(RAW_RESPONSE_BOUND)
            .read_to_end(&mut buf)
            .await?;
        Ok(buf)
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        io.write_all(&req).await?;
        io.flush().await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        _: &mut T,
        _: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Err(io::Error::other("the raw codec only sends"))
    }
}

/// The probe's behaviours, plus (in `garbage` mode) the raw outbound-only request-response.
#[derive(NetworkBehaviour)]
struct Attacker {
    probe: Probe,
    raw: Toggle<request_response::Behaviour<RawCodec>>,
}

/// The swarm: the probe's transport and behaviours, with the raw behaviour beside them.
fn build_swarm(
    key: &SigningKey,
    psk: Option<[u8; 32]>,
    kad_proto: &str,
    rr_proto: &str,
    raw: bool,
) -> Result<Swarm<Attacker>, String> {
    let kad_proto = StreamProtocol::try_from_owned(kad_proto.to_string())
        .map_err(|e| format!("kad protocol: {e}"))?;
    let rr_proto = StreamProtocol::try_from_owned(rr_proto.to_string())
        .map_err(|e| format!("rr protocol: {e}"))?;
    let rr_config = request_response::Config::default()
        .with_request_timeout(Duration::from_secs(30))
        .with_max_concurrent_streams(256);
    Ok(probe::build(libp2p_keypair(key), psk, |k| Attacker {
        probe: probe::behaviour(k, kad_proto, rr_proto.clone(), rr_config.clone()),
        raw: Toggle::from(raw.then(|| {
            request_response::Behaviour::with_codec(
                RawCodec,
                [(rr_proto, ProtocolSupport::Outbound)],
                rr_config,
            )
        })),
    }))
}

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
    current: Option<Status>,
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

impl Run {
    fn tally(&mut self, kind: &'static str) -> &mut Tally {
        self.tally.entry(kind).or_default()
    }

    fn send(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        peer: PeerId,
        req: Request,
        kind: &'static str,
        purpose: Purpose,
    ) {
        let id = swarm.behaviour_mut().probe.rr.send_request(&peer, req);
        self.tally(kind).sent += 1;
        self.pending.insert(
            id,
            Pending {
                peer,
                kind,
                purpose,
            },
        );
    }

    fn send_raw(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        peer: PeerId,
        bytes: Vec<u8>,
        kind: &'static str,
    ) {
        let Some(raw) = swarm.behaviour_mut().raw.as_mut() else {
            return;
        };
        let id = raw.send_request(&peer, bytes);
        self.tally(kind).sent += 1;
        self.raw_pending.insert(id, (peer, kind));
    }

    fn connected_trainers(&self) -> Vec<PeerId> {
        let mut v: Vec<PeerId> = self
            .trainers
            .iter()
            .filter(|p| self.connected.contains(p))
            .copied()
            .collect();
        v.sort();
        v
    }

    /// Dials the bootstrap and every known trainer we are not connected to.
    fn redial(&mut self, swarm: &mut Swarm<Attacker>) {
        if let Some(b) = self.boot
            && !self.connected.contains(&b)
            && swarm.dial(self.boot_addr.clone()).is_err()
        {
            self.dial_failures += 1;
        }
        let known: Vec<(PeerId, Vec<Multiaddr>)> = self
            .addrs
            .iter()
            .filter(|(p, a)| Some(**p) != self.boot && !self.connected.contains(p) && !a.is_empty())
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        for (p, a) in known {
            if swarm
                .dial(DialOpts::peer_id(p).addresses(a).build())
                .is_err()
            {
                self.dial_failures += 1;
            }
        }
    }

    /// Asks every connected peer for its status; looks for more peers.
    fn poll_statuses(&mut self, swarm: &mut Swarm<Attacker>) {
        let peers: Vec<PeerId> = self.connected.iter().copied().collect();
        for p in peers {
            self.send(swarm, p, Request::GetStatus, "get_status", Purpose::Status);
        }
        if !self.connected.is_empty() {
            swarm
                .behaviour_mut()
                .probe
                .kad
                .get_closest_peers(PeerId::random());
        }
    }

    /// Opens a status `peer` sent (an answer or an announcement) and learns from it; in the
    /// forging modes a higher honest round is answered at once with a forged state one round
    /// ahead of it.
    fn note_status(&mut self, swarm: &mut Swarm<Attacker>, peer: PeerId, env: &SignedEnvelope) {
        let status = match open_status(env, &self.swarm_id, None, unix_ms()) {
            Ok(s) if public_key_of(&peer) == Some(env.header.sender) => s,
            _ => {
                self.statuses_refused += 1;
                return;
            }
        };
        self.statuses_opened += 1;
        let mut newer = false;
        if status.role == NodeRole::Trainer {
            self.trainers.insert(peer);
            newer = self.honest_round.is_none_or(|r| status.round > r);
            self.honest_round = Some(self.honest_round.unwrap_or(0).max(status.round));
            self.honest_hashes.insert(status.round, status.state_hash);
            if self.honest_hashes.len() > 64
                && let Some(first) = self.honest_hashes.keys().next().copied()
            {
                self.honest_hashes.remove(&first);
            }
        }
        if self.mode == Mode::Replay && status.role == NodeRole::Trainer {
            let mut wants: Vec<(u64, [u8; 32])> =
                status.holding.iter().map(|k| (status.round, *k)).collect();
            if status.round > 0 {
                wants.extend(
                    status
                        .formed_by
                        .iter()
                        .map(|id| (status.round - 1, id.sender)),
                );
            }
            for w in wants {
                if w.1 != self.me
                    && self.asked.len() < 4 * MAX_CAPTURED
                    && self.captured.len() < MAX_CAPTURED
                    && self.asked.insert(w)
                {
                    self.send(
                        swarm,
                        peer,
                        Request::GetContribution {
                            round: w.0,
                            sender: w.1,
                        },
                        "get_contribution",
                        Purpose::Capture(w.0, w.1),
                    );
                }
            }
        }
        let finishing = status.role == NodeRole::Trainer
            && status.phase == Phase::Collecting
            && Some(status.round) == self.honest_round;
        self.statuses.insert(peer, status);
        if self.mode == Mode::Forge && finishing {
            // The swarm is about to enter round R+1: be one round ahead of it when it aligns.
            self.forge_claim(swarm, self.honest_round.unwrap_or(0).saturating_add(2));
        } else if newer && self.mode.forges() {
            // The swarm entered a new round: claim the next one now.
            self.flip = false;
            self.forge_tick(swarm);
        }
    }

    // ---- forge ----

    fn forge(&mut self, round: u64) -> (u64, Hash32) {
        if let Some(f) = self.forged.values().find(|f| f.round == round) {
            return (f.round, f.hash);
        }
        let n = self.num_params;
        // Named by its digest, as an honest state names its contributions: the one we serve.
        let own = ContributionId::of(&self.own_contribution(round.saturating_sub(1)));
        let state = match self.mode {
            Mode::Relabel => StateSnapshot {
                round,
                params: self.genesis.params.clone(),
                momentum: self.genesis.momentum.clone(),
                formed_by: vec![own],
                noise: self.genesis.noise,
            },
            _ => StateSnapshot {
                round,
                params: vec![0.0; n],
                momentum: vec![0.0; n],
                formed_by: vec![own],
                noise: None,
            },
        };
        let hash = state.hash();
        let encoded = Arc::new(wire::encode(&state));
        self.forged.insert(
            hash,
            Forged {
                round,
                hash,
                encoded,
                formed_by: state.formed_by,
            },
        );
        self.forged_log.push((round, hash));
        (round, hash)
    }

    fn forge_tick(&mut self, swarm: &mut Swarm<Attacker>) {
        let Some(r) = self.honest_round else {
            return;
        };
        self.flip = !self.flip;
        let target = match self.mode {
            Mode::Relabel => r.saturating_add(5),
            _ if self.flip => r.saturating_add(1),
            _ => r.saturating_add(5),
        };
        self.forge_claim(swarm, target);
    }

    /// Forges a state of round `target` (unless this round's is made already) and announces
    /// it, signed with our own key, to every connected peer.
    fn forge_claim(&mut self, swarm: &mut Swarm<Attacker>, target: u64) {
        if self
            .current
            .as_ref()
            .is_some_and(|c| c.round == target && unix_ms().saturating_sub(c.unix_ms) < 200)
        {
            return;
        }
        let (round, hash) = self.forge(target);
        let formed_by = self
            .forged
            .get(&hash)
            .map(|f| f.formed_by.clone())
            .unwrap_or_default();
        let status = Status {
            role: NodeRole::Trainer,
            phase: Phase::Ready,
            round,
            state_hash: hash,
            formed_by,
            holding: vec![],
            unix_ms: unix_ms(),
        };
        let env = sign_status(&self.key, self.swarm_id, &status);
        self.current = Some(status);
        let peers: Vec<PeerId> = self.connected.iter().copied().collect();
        for p in peers {
            self.announced += 1;
            self.send(
                swarm,
                p,
                Request::Announce(env.clone()),
                "announce",
                Purpose::Other,
            );
        }
    }

    /// Our own contribution for `round`, signed, a large constant in the swarm's codec.
    fn own_contribution(&mut self, round: u64) -> SignedEnvelope {
        let base = self
            .honest_hashes
            .get(&round)
            .copied()
            .or_else(|| {
                self.forged
                    .values()
                    .find(|f| f.round == round)
                    .map(|f| f.hash)
            })
            .unwrap_or_else(|| Hash32::of(&[b"hostile", &round.to_le_bytes()]));
        let c = Contribution {
            tokens: 1,
            inner_steps: 1,
            train_loss: 0.5,
            delta: delta::encode(
                self.manifest.manifest.training.codec,
                &vec![1000.0f32; self.num_params],
            ),
            expected: 1,
        };
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.swarm_id,
            round,
            sender: self.me,
            base_hash: base,
        };
        SignedEnvelope::sign(&self.key, header, wire::encode(&c))
    }

    fn answer(&mut self, req: Request) -> Response {
        let kind = kind_of(&req);
        *self.inbound.entry(kind).or_default() += 1;
        match req {
            Request::GetStatus => match &self.current {
                Some(s) if self.mode.forges() => {
                    let mut s = s.clone();
                    s.unix_ms = unix_ms();
                    Response::Status(sign_status(&self.key, self.swarm_id, &s))
                }
                _ => Response::Refused("not ready".into()),
            },
            Request::GetStateChunk { hash, offset, len } => match self.forged.get(&hash) {
                Some(f) => {
                    self.state_chunks_served += 1;
                    let total = f.encoded.len() as u64;
                    let start = offset.min(total) as usize;
                    let want = u64::from(len.min(MAX_CHUNK_BYTES));
                    let end = offset.saturating_add(want).min(total) as usize;
                    Response::StateChunk(Some(StateChunk {
                        total,
                        offset: start as u64,
                        bytes: f.encoded.get(start..end).unwrap_or_default().to_vec(),
                    }))
                }
                None => Response::StateChunk(None),
            },
            Request::GetContribution { round, sender }
                if sender == self.me && self.mode.forges() =>
            {
                self.contributions_served += 1;
                Response::Contribution(Some(self.own_contribution(round)))
            }
            Request::GetContribution { .. } => Response::Contribution(None),
            Request::GetState { .. } => Response::State(None),
            Request::GetManifest => Response::Manifest(None),
            Request::Push(_) | Request::Announce(_) => Response::Ack,
        }
    }

    // ---- replay ----

    fn replay_tick(&mut self, swarm: &mut Swarm<Attacker>) {
        let Some(r) = self.honest_round else {
            return;
        };
        let stale: Vec<SignedEnvelope> = self
            .captured
            .iter()
            .filter(|((round, _), _)| r >= round.saturating_add(2))
            .map(|(_, e)| e.clone())
            .take(8)
            .collect();
        let peers: Vec<PeerId> = self.connected.iter().copied().collect();
        for env in stale {
            for p in &peers {
                self.replays_pushed += 1;
                self.send(
                    swarm,
                    *p,
                    Request::Push(env.clone()),
                    "push_replayed",
                    Purpose::Other,
                );
            }
        }
    }

    // ---- garbage ----

    fn bad_push(&mut self, payload: usize) -> SignedEnvelope {
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.swarm_id,
            round: self.honest_round.unwrap_or(0),
            sender: self.me,
            base_hash: self
                .honest_round
                .and_then(|r| self.honest_hashes.get(&r).copied())
                .unwrap_or_default(),
        };
        SignedEnvelope {
            header,
            payload: self.junk.bytes(payload),
            signature: self.junk.bytes(64),
        }
    }

    fn garbage_tick(&mut self, swarm: &mut Swarm<Attacker>) {
        let trainers = self.connected_trainers();
        let get_status = wire::encode(&Request::GetStatus);
        let lookup = wire::encode(&Request::GetContribution {
            round: 7,
            sender: [9; 32],
        });
        let fitting = self.node_max_frame.saturating_sub(64 << 10).max(1024);
        for p in trainers {
            // A length prefix claiming ~4 GB, and nothing more.
            self.send_raw(swarm, p, 0xEE6B_2800u32.to_be_bytes().to_vec(), "raw_4gb");
            // 10 MB claimed for a small kind: the head of a GetStatus frame, then junk.
            let mut f = (10u32 << 20).to_be_bytes().to_vec();
            f.extend_from_slice(get_status.get(..2).unwrap_or(&[4, 1]));
            f.extend(self.junk.bytes(4096));
            self.send_raw(swarm, p, f, "raw_10mb_small_kind");
            // Valid lengths, random bytes; and random bodies behind a valid version and variant.
            for _ in 0..2 {
                let n = 16 + self.junk.below(8192) as usize;
                let mut f = (n as u32).to_be_bytes().to_vec();
                f.extend(self.junk.bytes(n));
                self.send_raw(swarm, p, f, "raw_random");
                let n = 16 + self.junk.below(4096) as usize;
                let mut f = (n as u32).to_be_bytes().to_vec();
                f.push(wire::WIRE_VERSION);
                f.push(self.junk.below(7) as u8);
                f.extend(self.junk.bytes(n - 2));
                self.send_raw(swarm, p, f, "raw_random_body");
            }
            // A truncated frame: the prefix of a whole look-up, half of its bytes.
            let mut f = (lookup.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(lookup.get(..lookup.len() / 2).unwrap_or_default());
            self.send_raw(swarm, p, f, "raw_truncated");
            // Well-formed pushes of random payloads under a bad signature: 2 MB (over the
            // node's frame bound for a small model) and one that fits the bound.
            let big = self.bad_push(BIG_PAYLOAD);
            self.send(
                swarm,
                p,
                Request::Push(big),
                "push_bad_sig_2mb",
                Purpose::Other,
            );
            let fit = self.bad_push(fitting);
            self.send(
                swarm,
                p,
                Request::Push(fit),
                "push_bad_sig_fitting",
                Purpose::Other,
            );
        }
    }

    // ---- flood ----

    fn flood_pushes(&mut self) {
        if self.big_push.is_some() {
            return;
        }
        let fitting = self.node_max_frame.saturating_sub(64 << 10).max(1024);
        let round = self.honest_round.unwrap_or(0).saturating_add(1000);
        for (size, slot) in [(BIG_PAYLOAD, 0), (fitting, 1)] {
            let header = EnvelopeHeader {
                kind: PayloadKind::Contribution,
                swarm_id: self.swarm_id,
                round,
                sender: self.me,
                base_hash: Hash32::of(&[b"nowhere"]),
            };
            let env = SignedEnvelope::sign(&self.key, header, self.junk.bytes(size));
            if slot == 0 {
                self.big_push = Some(env);
            } else {
                self.fitting_push = Some(env);
            }
        }
    }

    fn flood_refill(&mut self, swarm: &mut Swarm<Attacker>) {
        self.flood_pushes();
        let genesis = self.manifest.manifest.initial_state_hash;
        for p in self.connected_trainers() {
            let (mut small, mut push) = self.flood_inflight.get(&p).copied().unwrap_or_default();
            while small < FLOOD_SMALL_INFLIGHT {
                small += 1;
                if self.junk.below(2) == 0 {
                    self.send(
                        swarm,
                        p,
                        Request::GetStateChunk {
                            hash: genesis,
                            offset: 0,
                            len: MAX_CHUNK_BYTES,
                        },
                        "flood_state_chunk",
                        Purpose::Flood { push: false },
                    );
                } else {
                    self.send(
                        swarm,
                        p,
                        Request::GetStatus,
                        "flood_get_status",
                        Purpose::Flood { push: false },
                    );
                }
            }
            while push < FLOOD_PUSH_INFLIGHT {
                push += 1;
                let (env, kind) = if self.junk.below(2) == 0 {
                    (self.big_push.clone(), "flood_push_2mb")
                } else {
                    (self.fitting_push.clone(), "flood_push_fitting")
                };
                if let Some(env) = env {
                    self.send(
                        swarm,
                        p,
                        Request::Push(env),
                        kind,
                        Purpose::Flood { push: true },
                    );
                }
            }
            self.flood_inflight.insert(p, (small, push));
        }
    }

    fn flood_done(&mut self, peer: PeerId, push: bool) {
        if let Some((small, pushes)) = self.flood_inflight.get_mut(&peer) {
            if push {
                *pushes = pushes.saturating_sub(1);
            } else {
                *small = small.saturating_sub(1);
            }
        }
    }

    // ---- events ----

    fn on_event(&mut self, swarm: &mut Swarm<Attacker>, ev: SwarmEvent<AttackerEvent>) {
        match ev {
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                self.connected.insert(peer_id);
                self.ever_connected.insert(peer_id);
                if endpoint.is_dialer() {
                    let a = endpoint.get_remote_address().clone();
                    let list = self.addrs.entry(peer_id).or_default();
                    if !list.contains(&a) {
                        list.push(a);
                    }
                }
                self.send(
                    swarm,
                    peer_id,
                    Request::GetStatus,
                    "get_status",
                    Purpose::Status,
                );
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established,
                ..
            } => {
                self.disconnected += 1;
                if num_established == 0 {
                    self.connected.remove(&peer_id);
                    self.flood_inflight.remove(&peer_id);
                }
            }
            SwarmEvent::OutgoingConnectionError { .. } => self.dial_failures += 1,
            SwarmEvent::Behaviour(AttackerEvent::Probe(ProbeEvent::Kad(
                kad::Event::OutboundQueryProgressed {
                    result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                    ..
                },
            ))) => {
                for info in ok.peers {
                    if info.peer_id == self.local || info.addrs.is_empty() {
                        continue;
                    }
                    let list = self.addrs.entry(info.peer_id).or_default();
                    for a in &info.addrs {
                        if !list.contains(a) {
                            list.push(a.clone());
                        }
                    }
                    if !self.connected.contains(&info.peer_id) {
                        let opts = DialOpts::peer_id(info.peer_id)
                            .addresses(info.addrs)
                            .build();
                        if swarm.dial(opts).is_err() {
                            self.dial_failures += 1;
                        }
                    }
                }
            }
            SwarmEvent::Behaviour(AttackerEvent::Probe(ProbeEvent::Rr(ev))) => {
                self.on_rr(swarm, ev);
            }
            SwarmEvent::Behaviour(AttackerEvent::Raw(ev)) => self.on_raw(ev),
            _ => {}
        }
    }

    fn on_rr(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        ev: request_response::Event<Request, Response>,
    ) {
        use request_response::{Event, Message};
        match ev {
            Event::Message {
                message:
                    Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let resp = self.answer(request);
                let _ = swarm.behaviour_mut().probe.rr.send_response(channel, resp);
            }
            Event::Message {
                peer,
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                let Some(p) = self.pending.remove(&request_id) else {
                    return;
                };
                self.tally(p.kind).answered += 1;
                if matches!(response, Response::Refused(_)) {
                    self.refused_answers += 1;
                }
                match (p.purpose, response) {
                    (Purpose::Status, Response::Status(env)) => self.note_status(swarm, peer, &env),
                    (Purpose::Capture(round, sender), Response::Contribution(Some(env)))
                        if env.header.round == round
                            && env.header.sender == sender
                            && self.captured.len() < MAX_CAPTURED =>
                    {
                        self.captured.insert((round, sender), env);
                    }
                    (Purpose::Flood { push }, _) => self.flood_done(p.peer, push),
                    _ => {}
                }
            }
            Event::OutboundFailure { request_id, .. } => {
                if let Some(p) = self.pending.remove(&request_id) {
                    self.tally(p.kind).failed += 1;
                    if let Purpose::Flood { push } = p.purpose {
                        self.flood_done(p.peer, push);
                    }
                }
            }
            Event::InboundFailure { .. } => self.inbound_failures += 1,
            Event::ResponseSent { .. } => {}
        }
    }

    fn on_raw(&mut self, ev: request_response::Event<Vec<u8>, Vec<u8>>) {
        use request_response::{Event, Message};
        match ev {
            Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                if let Some((_, kind)) = self.raw_pending.remove(&request_id) {
                    self.tally(kind).answered += 1;
                    if response.is_empty() {
                        self.raw_closed += 1;
                    } else {
                        self.raw_answered += 1;
                    }
                }
            }
            Event::OutboundFailure { request_id, .. } => {
                if let Some((_, kind)) = self.raw_pending.remove(&request_id) {
                    self.tally(kind).failed += 1;
                }
            }
            _ => {}
        }
    }

    fn report(&self, secs: f64) -> serde_json::Value {
        let total = |f: fn(&Tally) -> u64| self.tally.values().map(f).sum::<u64>();
        let by_kind: serde_json::Map<String, serde_json::Value> = self
            .tally
            .iter()
            .map(|(k, t)| {
                (
                    (*k).to_string(),
                    serde_json::json!({"sent": t.sent, "answered": t.answered, "failed": t.failed}),
                )
            })
            .collect();
        let mut trainers: Vec<String> = self.trainers.iter().map(|p| p.to_string()).collect();
        trainers.sort();
        serde_json::json!({
            "mode": self.mode.name(),
            "peer_id": self.local.to_string(),
            "public_key": hex::encode(self.me),
            "secs": secs,
            "connected_peers": self.ever_connected.len(),
            "connected_at_end": self.connected.len(),
            "disconnected": self.disconnected,
            "dial_failures": self.dial_failures,
            "requests": total(|t| t.sent),
            "answered": total(|t| t.answered),
            "failed": total(|t| t.failed),
            "refused_answers": self.refused_answers,
            "raw_closed": self.raw_closed,
            "raw_answered": self.raw_answered,
            "by_kind": by_kind,
            "inbound": self.inbound.iter().map(|(k, v)| ((*k).to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
            "inbound_failures": self.inbound_failures,
            "statuses_opened": self.statuses_opened,
            "statuses_refused": self.statuses_refused,
            "honest_round": self.honest_round,
            "trainers": trainers,
            "forged": self.forged_log.iter().map(|(r, h)| serde_json::json!({"round": r, "hash": h.to_hex()})).collect::<Vec<_>>(),
            "announced": self.announced,
            "contributions_served": self.contributions_served,
            "state_chunks_served": self.state_chunks_served,
            "captured": self.captured.keys().map(|(r, k)| serde_json::json!({"round": r, "sender": hex::encode(&k[..6])})).collect::<Vec<_>>(),
            "replays_pushed": self.replays_pushed,
        })
    }
}

fn kind_of(r: &Request) -> &'static str {
    match r {
        Request::Announce(_) => "announce",
        Request::GetStatus => "get_status",
        Request::Push(_) => "push",
        Request::GetContribution { .. } => "get_contribution",
        Request::GetState { .. } => "get_state",
        Request::GetManifest => "get_manifest",
        Request::GetStateChunk { .. } => "get_state_chunk",
    }
}

async fn run(args: Args) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(&args.manifest)
        .map_err(|e| format!("cannot read {}: {e}", args.manifest.display()))?;
    let manifest: SignedManifest =
        serde_json::from_str(&text).map_err(|e| format!("not a manifest: {e}"))?;
    let key = match &args.key {
        Some(p) => nightshift_bootstrap::read_key(p).map_err(|e| e.to_string())?,
        None => nightshift_bootstrap::generate_key().map_err(|e| e.to_string())?,
    };
    let psk = args
        .swarm_key
        .as_deref()
        .map(nightshift_bootstrap::read_swarm_key)
        .transpose()
        .map_err(|e| e.to_string())?;
    let swarm_id = manifest.swarm_id();
    let (kad_proto, rr_proto) = protocol_names(&swarm_id);
    let mut swarm = build_swarm(&key, psk, &kad_proto, &rr_proto, args.mode == Mode::Garbage)?;
    let genesis = Arc::new(nightshift_bootstrap::genesis_state(&manifest.manifest));
    let num_params = genesis.params.len();
    let node_max_frame = (2 * delta::dense_bytes(num_params) * 2 + (1 << 20))
        .min(nightshift_protocol::MAX_MESSAGE_BYTES);
    let boot = match args.bootstrap.iter().last() {
        Some(Protocol::P2p(id)) => Some(id),
        _ => None,
    };
    if let Some(b) = boot {
        swarm
            .behaviour_mut()
            .probe
            .kad
            .add_address(&b, args.bootstrap.clone());
    }
    let seed = unix_ms() ^ u64::from(std::process::id()).rotate_left(32) | 1;
    let me = key.verifying_key().to_bytes();
    let mut st = Run {
        mode: args.mode,
        manifest,
        swarm_id,
        local: *swarm.local_peer_id(),
        key,
        me,
        boot,
        boot_addr: args.bootstrap.clone(),
        num_params,
        node_max_frame,
        genesis,
        junk: Junk(seed),
        connected: HashSet::new(),
        ever_connected: HashSet::new(),
        addrs: HashMap::new(),
        statuses: HashMap::new(),
        trainers: HashSet::new(),
        disconnected: 0,
        dial_failures: 0,
        statuses_opened: 0,
        statuses_refused: 0,
        honest_round: None,
        honest_hashes: BTreeMap::new(),
        pending: HashMap::new(),
        raw_pending: HashMap::new(),
        tally: BTreeMap::new(),
        refused_answers: 0,
        raw_closed: 0,
        raw_answered: 0,
        inbound: BTreeMap::new(),
        inbound_failures: 0,
        forged: HashMap::new(),
        forged_log: vec![],
        current: None,
        flip: false,
        announced: 0,
        contributions_served: 0,
        state_chunks_served: 0,
        captured: BTreeMap::new(),
        asked: HashSet::new(),
        replays_pushed: 0,
        flood_inflight: HashMap::new(),
        big_push: None,
        fitting_push: None,
    };
    if swarm.dial(args.bootstrap.clone()).is_err() {
        st.dial_failures += 1;
    }
    let t0 = Instant::now();
    let end = tokio::time::Instant::now() + Duration::from_secs(args.secs);
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let mut fast = tokio::time::interval(Duration::from_millis(20));
    fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            ev = swarm.select_next_some() => {
                st.on_event(&mut swarm, ev);
                if st.mode == Mode::Flood {
                    st.flood_refill(&mut swarm);
                }
            }
            _ = second.tick() => {
                ticks += 1;
                if ticks.is_multiple_of(3) {
                    st.redial(&mut swarm);
                }
                st.poll_statuses(&mut swarm);
                match st.mode {
                    Mode::Forge | Mode::Relabel => st.forge_tick(&mut swarm),
                    Mode::Replay => st.replay_tick(&mut swarm),
                    Mode::Garbage => st.garbage_tick(&mut swarm),
                    Mode::Flood => {}
                }
            }
            _ = fast.tick(), if st.mode == Mode::Flood => st.flood_refill(&mut swarm),
            _ = tokio::time::sleep_until(end) => break,
            _ = term.recv() => break,
        }
    }
    Ok(st.report(t0.elapsed().as_secs_f64()))
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
