//! The doctor's checks, each returning findings that say what to do.

use nightshift_protocol::{ModelSpec, SignedManifest};
use serde_json::Value;
use std::path::Path;

use super::{DoctorArgs, Finding, Level};
use crate::net::reach::Reachability;
use crate::store::Store;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// A clock further off than this from a peer's is refused by it (statuses carry the time).
const CLOCK_REFUSED_MS: i64 = nightshift_protocol::message::MAX_STATUS_SKEW_MS as i64;
/// A clock further off than this is worth fixing before it is refused.
const CLOCK_WARN_MS: i64 = 30_000;

/// `MemTotal` and `MemAvailable` of /proc/meminfo, in bytes.
fn memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Parameters of the model a manifest describes (the GPT of `nightshift-model`).
pub(super) fn model_params(m: &ModelSpec) -> u64 {
    let (v, d, ff, s, l) = (
        m.vocab_size as u64,
        m.d_model as u64,
        m.d_ff as u64,
        m.seq_len as u64,
        m.n_layers as u64,
    );
    let layer = 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d;
    v * d + s * d + l * layer + 2 * d + d * v
}

/// Bytes a training node holds for a model of `params` parameters: θ, its gradient, AdamW's two
/// moments, the round's start, the outer momentum, the error feedback and the delta (f32 each);
/// activations come on top.
fn training_bytes(params: u64) -> u64 {
    params * 4 * 8
}

pub(super) fn device() -> Vec<Finding> {
    let s = "device";
    let mut out = vec![];
    let threads = crate::cmd::demo::cores();
    match memory() {
        Some((total, avail)) => out.push(Finding::new(
            s,
            Level::Ok,
            format!(
                "CPU: {threads} threads; memory {:.1} GiB, {:.1} GiB available",
                total as f64 / GIB,
                avail as f64 / GIB
            ),
        )),
        None => out.push(Finding::new(
            s,
            Level::Info,
            format!("CPU: {threads} threads; memory unknown (no /proc/meminfo)"),
        )),
    }
    let driver = nightshift_model::backend::cuda_available();
    let gpus = crate::idle::gpu_inventory();
    match &gpus {
        Ok(list) if !list.is_empty() => {
            for g in list {
                out.push(Finding::new(
                    s,
                    Level::Ok,
                    format!(
                        "GPU {}: {}, {:.1} GiB of which {:.1} GiB in use, {} process(es){}{}",
                        g.index,
                        g.name,
                        g.memory_total_bytes as f64 / GIB,
                        g.memory_used_bytes as f64 / GIB,
                        g.processes,
                        g.utilization_percent
                            .map(|u| format!(", {u} % busy"))
                            .unwrap_or_default(),
                        g.driver_version
                            .as_deref()
                            .map(|v| format!(" (driver {v})"))
                            .unwrap_or_default(),
                    ),
                ));
            }
        }
        Ok(_) => out.push(
            Finding::new(s, Level::Info, "NVML found an NVIDIA driver but no GPU")
                .todo("check `nvidia-smi`; this node trains on the CPU"),
        ),
        Err(e) if driver => out.push(
            Finding::new(
                s,
                Level::Warn,
                format!("an NVIDIA driver is installed but NVML does not answer: {e:#}"),
            )
            .todo(
                "the `auto` idle source then watches the CPU instead of the GPU; reinstall the \
                 driver's NVML library (libnvidia-ml.so.1) or use --idle schedule:...",
            ),
        ),
        Err(_) => out.push(Finding::new(
            s,
            Level::Info,
            "no NVIDIA GPU: no NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1) on this machine",
        )),
    }
    let cuda_build = cfg!(feature = "cuda");
    match (cuda_build, driver) {
        (false, false) => out.push(
            Finding::new(s, Level::Info, "this node trains on the CPU").todo(
                "for an NVIDIA GPU: install its driver and build nightshift with \
                 `--features cuda`",
            ),
        ),
        (false, true) => out.push(
            Finding::new(
                s,
                Level::Warn,
                "this build trains on the CPU although this machine has an NVIDIA driver",
            )
            .todo("build nightshift with `--features cuda` to train on the GPU"),
        ),
        (true, false) => out.push(
            Finding::new(
                s,
                Level::Warn,
                "this build can use CUDA, but there is no NVIDIA driver: it trains on the CPU",
            )
            .todo("install NVIDIA's driver (libcuda.so.1) to train on the GPU"),
        ),
        (true, true) => out.push(cuda_check()),
    }
    out
}

#[cfg(feature = "cuda")]
fn cuda_check() -> Finding {
    match nightshift_model::backend::cuda_smoke_test() {
        Ok(()) => Finding::new(
            "device",
            Level::Ok,
            "CUDA works: a matrix product on the GPU through burn-cuda gave the right result; \
             this node trains on the GPU",
        ),
        Err(e) => Finding::new(
            "device",
            Level::Fail,
            format!("CUDA is installed but a computation on the GPU failed: {e}"),
        )
        .todo("check the driver with `nvidia-smi`; until then use a build without `cuda`"),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_check() -> Finding {
    unreachable!("only a cuda build checks CUDA")
}

pub(super) fn idle(specs: &[String]) -> Vec<Finding> {
    let s = "idle";
    let mut out = vec![];
    for spec in specs {
        let mut source = match crate::idle::parse_spec(spec) {
            Ok(source) => source,
            Err(e) => {
                out.push(
                    Finding::new(s, Level::Fail, format!("--idle {spec}: {e:#}"))
                        .todo("choose another idle source (see `nightshift run --help`)"),
                );
                continue;
            }
        };
        // The first CPU sample covers only 100 ms; the second one is the verdict.
        source.check();
        std::thread::sleep(std::time::Duration::from_millis(500));
        let name = source.name().to_string();
        let shown = if name == *spec {
            spec.clone()
        } else {
            format!("{spec} ({name})")
        };
        out.push(match source.check() {
            crate::idle::Verdict::Idle { until } => Finding::new(
                s,
                Level::Ok,
                match until {
                    Some(t) => format!(
                        "{shown}: idle until {}",
                        chrono::DateTime::<chrono::Local>::from(t).format("%a %H:%M")
                    ),
                    None => format!("{shown}: idle now, the node would train"),
                },
            ),
            crate::idle::Verdict::Busy(why) => {
                Finding::new(s, Level::Info, format!("{shown}: busy now: {why}")).todo(
                    "the node waits until the machine is idle; `--idle always` trains regardless",
                )
            }
        });
    }
    out
}

pub(super) fn data_dir(a: &DoctorArgs, running: Option<&Value>) -> Vec<Finding> {
    let s = "data";
    let dir = &a.data_dir;
    let shown = dir.display();
    let mut out = vec![];
    if let Some(v) = running {
        out.push(Finding::new(
            s,
            Level::Ok,
            format!(
                "a node runs in {shown}: round {}, {}, {}",
                v["round"],
                v["phase"].as_str().unwrap_or("?"),
                v["idle_reason"].as_str().unwrap_or("?")
            ),
        ));
        out.extend(disk(dir, None));
        return out;
    }
    if !dir.exists() {
        out.push(
            Finding::new(s, Level::Info, format!("no data directory at {shown} yet"))
                .todo(format!("`nightshift run --data-dir {shown}` creates it")),
        );
        out.extend(disk(dir, None));
        return out;
    }
    let store = match Store::open(&dir.join("db")) {
        Ok(store) => store,
        Err(e) => {
            out.push(
                Finding::new(
                    s,
                    Level::Fail,
                    format!("cannot open the node's database in {shown}: {e}"),
                )
                .todo(
                    "if another nightshift command uses it, wait for it to end; if the database \
                     is damaged, move the directory aside: a new one syncs the swarm's state from \
                     its peers",
                ),
            );
            return out;
        }
    };
    match store.identity() {
        Ok(Some(secret)) => {
            let key = ed25519_dalek::SigningKey::from_bytes(&secret);
            let id = crate::net::libp2p_keypair(&key).public().to_peer_id();
            out.push(Finding::new(s, Level::Ok, format!("identity: peer {id}")));
        }
        Ok(None) => out.push(Finding::new(
            s,
            Level::Info,
            "no identity stored: `run` uses its --key file, or creates and stores one",
        )),
        Err(e) => out.push(
            Finding::new(
                s,
                Level::Fail,
                format!("the stored identity is unreadable: {e}"),
            )
            .todo("give `run --key FILE`, or move the data directory aside"),
        ),
    }
    let manifest = match (&a.manifest, store.manifest()) {
        (Some(p), _) => crate::cmd::common::read_manifest(p).map(Some),
        (None, m) => m.map_err(anyhow::Error::from),
    };
    let manifest = match manifest {
        Ok(Some(m)) => Some(m),
        Ok(None) => {
            out.push(Finding::new(
                s,
                Level::Info,
                "no swarm stored yet: the first `run` stores its manifest",
            ));
            None
        }
        Err(e) => {
            out.push(Finding::new(
                s,
                Level::Fail,
                format!("the swarm manifest: {e:#}"),
            ));
            None
        }
    };
    let checkpoint = store.checkpoint();
    if let Some(m) = &manifest {
        out.extend(swarm(m, a.data.as_deref(), a.tokenizer.as_deref()));
    }
    match checkpoint {
        Ok(Some(c)) => {
            let finite = c.params.iter().chain(&c.momentum).all(|v| v.is_finite());
            let fits = manifest
                .as_ref()
                .is_none_or(|m| model_params(&m.manifest.model) == c.params.len() as u64);
            let rounds = store.checkpoint_rounds().map(|r| r.len()).unwrap_or(0);
            out.push(match (finite, fits) {
                (true, true) => Finding::new(
                    s,
                    Level::Ok,
                    format!(
                        "checkpoint: round {}, state {} ({rounds} kept); the node resumes there",
                        c.round,
                        c.hash().short()
                    ),
                ),
                (false, _) => Finding::new(
                    s,
                    Level::Fail,
                    format!(
                        "the checkpoint of round {} holds non-finite values",
                        c.round
                    ),
                )
                .todo("move the data directory aside: a new one syncs from its peers"),
                (true, false) => Finding::new(
                    s,
                    Level::Fail,
                    format!(
                        "the checkpoint of round {} does not fit the swarm's model",
                        c.round
                    ),
                )
                .todo("this directory belongs to another swarm: use another --data-dir"),
            });
        }
        Ok(None) => out.push(Finding::new(
            s,
            Level::Info,
            "no checkpoint yet: the node starts from the swarm's genesis or syncs from peers",
        )),
        Err(e) => out.push(
            Finding::new(s, Level::Fail, format!("the checkpoint is unreadable: {e}"))
                .todo("move the data directory aside: a new one syncs from its peers"),
        ),
    }
    let params = manifest.as_ref().map(|m| model_params(&m.manifest.model));
    out.extend(disk(dir, params));
    out
}

/// The swarm a manifest describes, the memory its model needs and whether its data is here.
fn swarm(m: &SignedManifest, data: Option<&Path>, tokenizer: Option<&Path>) -> Vec<Finding> {
    let s = "data";
    let md = &m.manifest;
    let params = model_params(&md.model);
    let mut out = vec![Finding::new(
        s,
        Level::Ok,
        format!(
            "swarm {} \"{}\": a model of {} parameters, about {:.1} MiB to train (plus \
             activations)",
            m.swarm_id().short(),
            md.name,
            if params >= 1_000_000 {
                format!("{:.1}M", params as f64 / 1e6)
            } else {
                format!("{:.0}k", params as f64 / 1e3)
            },
            training_bytes(params) as f64 / MIB
        ),
    )];
    if let Some((_, avail)) = memory()
        && training_bytes(params) > avail
    {
        out.push(
            Finding::new(
                s,
                Level::Warn,
                format!(
                    "the model needs more memory than is available ({:.1} GiB)",
                    avail as f64 / GIB
                ),
            )
            .todo("close other programs, or join a swarm with a smaller model"),
        );
    }
    let d = &md.training.data;
    match nightshift_genesis::load_data(d, &md.model.vocab, md.model.vocab_size, data, tokenizer) {
        Ok((dataset, tok)) => out.push(Finding::new(
            s,
            Level::Ok,
            format!(
                "training data {}: {} file(s), {:.1} MB, {} shards, {} tokens; matches the manifest",
                data.map_or_else(|| d.name.clone(), |p| p.display().to_string()),
                d.files.len(),
                d.bytes() as f64 / 1e6,
                dataset.shard_count(),
                if tok.byte_vocab().is_some() {
                    format!("{} byte", tok.len())
                } else {
                    format!("{} tokenizer.json", tok.len())
                },
            ),
        )),
        Err(e) => out.push(Finding::new(s, Level::Fail, format!("{e:#}")).todo(
            "give the swarm's data with `--data PATH` (and its tokenizer with `--tokenizer FILE`) \
             to `run`, and here to check them",
        )),
    }
    out
}

/// Free space where the data directory is (or will be).
fn disk(dir: &Path, params: Option<u64>) -> Vec<Finding> {
    let s = "data";
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("."));
    let Ok(st) = nix::sys::statvfs::statvfs(existing) else {
        return vec![];
    };
    // The field types differ between platforms (u64 on Linux x86-64).
    #[allow(clippy::unnecessary_cast)]
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    // Two kept checkpoints (θ and momentum, f32) and a download of one more.
    let need = params.map_or(1 << 30, |p| p * 8 * 3).max(256 << 20);
    let what = format!(
        "disk: {:.1} GiB free at {}",
        free as f64 / GIB,
        existing.display()
    );
    vec![if free < need {
        Finding::new(s, Level::Warn, what).todo(format!(
            "checkpoints need about {:.0} MiB: free some space or use another --data-dir",
            need as f64 / MIB
        ))
    } else {
        Finding::new(s, Level::Ok, what)
    }]
}

/// Whether the listen port can be bound (when no node holds it).
pub(super) fn port(listen: &libp2p::Multiaddr, running: bool) -> Vec<Finding> {
    use libp2p::multiaddr::Protocol;
    let s = "port";
    let mut ip = None;
    let mut tcp = None;
    for p in listen.iter() {
        match p {
            Protocol::Ip4(a) => ip = Some(std::net::IpAddr::V4(a)),
            Protocol::Ip6(a) => ip = Some(std::net::IpAddr::V6(a)),
            Protocol::Tcp(port) => tcp = Some(port),
            _ => {}
        }
    }
    let (Some(ip), Some(port)) = (ip, tcp) else {
        return vec![Finding::new(
            s,
            Level::Info,
            format!("{listen}: not an IP address with a TCP port; not checked"),
        )];
    };
    if running {
        return vec![];
    }
    if port == 0 {
        return vec![
            Finding::new(
                s,
                Level::Info,
                "the node listens on a port the system picks",
            )
            .todo(
                "to be reachable directly from the internet, give `run --listen \
                 /ip4/0.0.0.0/tcp/PORT` and forward that port (TCP and UDP) on the router; \
                 without it, peers behind NATs reach this node through a relay",
            ),
        ];
    }
    let addr = std::net::SocketAddr::new(ip, port);
    let tcp_ok = std::net::TcpListener::bind(addr);
    let udp_ok = std::net::UdpSocket::bind(addr);
    match (tcp_ok, udp_ok) {
        (Ok(_), Ok(_)) => vec![Finding::new(
            s,
            Level::Ok,
            format!("port {port} is free on {ip} (TCP, and UDP for QUIC)"),
        )],
        (Err(e), _) | (_, Err(e)) => vec![
            Finding::new(
                s,
                Level::Fail,
                format!("port {port} on {ip} cannot be used: {e}"),
            )
            .todo("another program (or another node) holds it: choose another --listen port"),
        ],
    }
}

pub(super) fn network(
    dir: &Path,
    source: Option<&str>,
    reach: Option<&Reachability>,
) -> Vec<Finding> {
    let s = "network";
    let (Some(source), Some(r)) = (source, reach) else {
        return vec![
            Finding::new(
                s,
                Level::Info,
                format!(
                    "reachability not checked: no node runs in {}",
                    dir.display()
                ),
            )
            .todo(
                "give --bootstrap ADDR (and --manifest) to probe this machine through the \
                 swarm's bootstrap nodes, or run doctor again while the node runs",
            ),
        ];
    };
    let level = match r.nat.as_str() {
        "public" => Level::Ok,
        "private" if r.relayed_addresses.is_empty() => Level::Warn,
        "private" => Level::Info,
        _ => Level::Warn,
    };
    let mut lines = r.explain().into_iter();
    let first = lines.next().unwrap_or_default();
    let mut f = Finding::new(s, level, format!("{first} ({source})"));
    let rest: Vec<String> = lines.collect();
    if !rest.is_empty() {
        f = f.todo(rest.join("; "));
    }
    vec![f]
}

/// The clock against the peers a running node hears from.
pub(super) fn clock(running: Option<&Value>) -> Vec<Finding> {
    let s = "clock";
    let Some(v) = running else {
        return vec![
            Finding::new(
                s,
                Level::Info,
                "not compared with peers: a running node measures it from their signed statuses",
            )
            .todo("run doctor again while the node runs in --data-dir"),
        ];
    };
    let mut offsets: Vec<i64> = v["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["clock_offset_ms"].as_i64())
        .collect();
    if offsets.is_empty() {
        return vec![Finding::new(
            s,
            Level::Info,
            "not compared yet: no peer has sent this node a status",
        )];
    }
    offsets.sort_unstable();
    let median = offsets[offsets.len() / 2];
    let worst = offsets.iter().copied().max_by_key(|o| o.abs()).unwrap_or(0);
    // Peers' clocks relative to ours: a median far from zero means ours is off.
    let what = format!(
        "peers' clocks are {:+.1} s from this machine's (median of {}; furthest {:+.1} s)",
        median as f64 / 1000.0,
        offsets.len(),
        worst as f64 / 1000.0
    );
    let fix = "synchronise the system clock (NTP: `timedatectl set-ntp true`)";
    vec![if median.abs() > CLOCK_REFUSED_MS {
        Finding::new(
            s,
            Level::Fail,
            format!("{what}: peers refuse this node's statuses"),
        )
        .todo(fix)
    } else if median.abs() > CLOCK_WARN_MS {
        Finding::new(s, Level::Warn, what).todo(fix)
    } else {
        Finding::new(s, Level::Ok, what)
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_count_matches_the_model() {
        let spec = ModelSpec {
            vocab: (0..84).collect(),
            vocab_size: 84,
            d_model: 32,
            n_layers: 2,
            n_heads: 2,
            d_ff: 128,
            seq_len: 16,
        };
        let cfg = nightshift_genesis::model_config(&spec);
        let model =
            cfg.init::<nightshift_model::backend::Cpu>(&nightshift_model::backend::cpu_device());
        let flat =
            nightshift_model::flat::genesis_params::<nightshift_model::backend::Cpu, _>(&model, 1);
        assert_eq!(model_params(&spec), flat.len() as u64);
    }

    #[test]
    fn a_clock_far_off_the_peers_is_a_failure_and_a_close_one_is_fine() {
        let status = |offsets: &[i64]| {
            serde_json::json!({"peers": offsets.iter()
                .map(|o| serde_json::json!({"clock_offset_ms": o})).collect::<Vec<_>>()})
        };
        assert_eq!(clock(Some(&status(&[120, -40, 300])))[0].level, Level::Ok);
        assert_eq!(
            clock(Some(&status(&[45_000, 46_000])))[0].level,
            Level::Warn
        );
        let far = clock(Some(&status(&[-700_000, -690_000, 100])));
        assert_eq!(far[0].level, Level::Fail);
        assert!(far[0].todo.as_deref().unwrap().contains("NTP"));
        assert_eq!(clock(None)[0].level, Level::Info);
    }
}
