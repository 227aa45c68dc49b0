//! A WAN in user space, for links slower than loopback where the kernel has no `netem` (this
//! sandbox's kernel has tbf and htb but not netem, and netem is what shapes delay and loss).
//!
//! Each host is a network namespace with a TUN device `wan0` at 10.9.0.(i + 2)/24. This process
//! holds every TUN's file descriptor and carries each IPv4 packet from its sender's TUN to its
//! destination's, through the sender's uplink and the receiver's downlink. Every link has a
//! rate (serialisation at that many bits per second, one packet after another), a one-way delay
//! (a path's delay is the sum of its two links': two hosts with 25 ms links are 50 ms apart,
//! 100 ms round trip), random loss on the uplink, and a drop-tail buffer of half a second at
//! the link's rate (as home routers buffer). Real sockets, real TCP: only the wire is emulated.
//!
//! Needs root, `ip` and `/dev/net/tun`; runs on the caller's tokio runtime.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One host's link to the WAN (both directions alike).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Megabits per second; `f64::INFINITY` for no limit.
    pub mbps: f64,
    /// One-way delay of this link, in milliseconds.
    pub delay_ms: f64,
    /// Share of the packets this host sends that are lost, in percent.
    pub loss_pct: f64,
}

impl Shape {
    /// No limit, no delay, no loss.
    pub const OPEN: Shape = Shape {
        mbps: f64::INFINITY,
        delay_ms: 0.0,
        loss_pct: 0.0,
    };
}

/// How long a link's buffer may hold packets before it drops new ones.
const BUFFER_SECS: f64 = 0.5;

/// The emulated WAN; dropping it stops the carrier and deletes the namespaces.
pub struct Wan {
    prefix: String,
    names: Vec<String>,
    tasks: Vec<JoinHandle<()>>,
    /// Packets dropped (lost, or a buffer was full).
    pub dropped: Arc<AtomicU64>,
}

enum Stage {
    /// The packet has crossed the sender's uplink and its delay: on to the receiver's downlink.
    Down,
    /// The packet has crossed the receiver's downlink: write it to the receiver's TUN.
    Deliver,
}

struct Event {
    at: Instant,
    seq: u64,
    to: usize,
    stage: Stage,
    packet: Vec<u8>,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Earliest first (a max-heap of reversed order).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

struct Queue {
    events: BinaryHeap<Event>,
    seq: u64,
    /// When each host's uplink and downlink are next free.
    up_free: Vec<Option<Instant>>,
    down_free: Vec<Option<Instant>>,
    rng: u64,
}

impl Queue {
    fn push(&mut self, at: Instant, to: usize, stage: Stage, packet: Vec<u8>) {
        self.seq += 1;
        self.events.push(Event {
            at,
            seq: self.seq,
            to,
            stage,
            packet,
        });
    }

    /// xorshift: loss decisions need no quality beyond this.
    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// When a packet of `bytes` entering a link of `shape` at `now` has been serialised onto it,
/// given when the link is next free; `None` when the buffer is full (the packet is dropped).
fn serialise(
    free: &mut Option<Instant>,
    now: Instant,
    bytes: usize,
    shape: &Shape,
) -> Option<Instant> {
    if !shape.mbps.is_finite() {
        return Some(now);
    }
    let start = free.map_or(now, |f| f.max(now));
    if start.duration_since(now).as_secs_f64() > BUFFER_SECS {
        return None;
    }
    let done = start + Duration::from_secs_f64(bytes as f64 * 8.0 / (shape.mbps * 1e6));
    *free = Some(done);
    Some(done)
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates the TUN device `wan0` inside namespace `ns`, from a thread that enters it (a
/// namespace is per thread) and ends.
fn open_tun(ns: &str) -> Result<tun::Device, String> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| -> Result<tun::Device, String> {
            let nsf = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            nix::sched::setns(&nsf, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot enter {ns}: {e}"))?;
            let mut cfg = tun::Configuration::default();
            cfg.tun_name("wan0").layer(tun::Layer::L3);
            tun::create(&cfg).map_err(|e| format!("cannot create a TUN device in {ns}: {e}"))
        })
        .join()
        .map_err(|_| "the thread creating a TUN device panicked".to_string())?
    })
}

impl Wan {
    /// Host `i`'s address.
    pub fn ip(i: usize) -> String {
        format!("10.9.0.{}", i + 2)
    }

    /// Namespace of host `i`.
    pub fn ns(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    /// Creates one namespace per shape (host `i`'s link is `shapes[i]`) and starts carrying.
    pub fn start(prefix: &str, shapes: &[Shape]) -> Result<Wan, String> {
        assert!(shapes.len() <= 250, "at most 250 hosts on 10.9.0.0/24");
        let mut wan = Wan {
            prefix: prefix.into(),
            names: vec![],
            tasks: vec![],
            dropped: Arc::new(AtomicU64::new(0)),
        };
        let mut devices = vec![];
        for i in 0..shapes.len() {
            let ns = wan.ns(i);
            let _ = sh(&["ip", "netns", "del", &ns]);
            sh(&["ip", "netns", "add", &ns])?;
            wan.names.push(ns.clone());
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            let dev = open_tun(&ns)?;
            let addr = format!("{}/24", Self::ip(i));
            sh(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "wan0"])?;
            sh(&["ip", "-n", &ns, "link", "set", "wan0", "up"])?;
            devices
                .push(tun::AsyncDevice::new(dev).map_err(|e| format!("TUN device of {ns}: {e}"))?);
        }
        let devices = Arc::new(devices);
        let shapes: Arc<Vec<Shape>> = Arc::new(shapes.to_vec());
        let queue = Arc::new(Mutex::new(Queue {
            events: BinaryHeap::new(),
            seq: 0,
            up_free: vec![None; shapes.len()],
            down_free: vec![None; shapes.len()],
            rng: 0x9E37_79B9_7F4A_7C15,
        }));
        let wake = Arc::new(Notify::new());
        for i in 0..shapes.len() {
            let (devices, shapes, queue, wake, dropped) = (
                devices.clone(),
                shapes.clone(),
                queue.clone(),
                wake.clone(),
                wan.dropped.clone(),
            );
            wan.tasks.push(tokio::spawn(async move {
                read_host(i, &devices, &shapes, &queue, &wake, &dropped).await;
            }));
        }
        let dropped = wan.dropped.clone();
        wan.tasks.push(tokio::spawn(async move {
            carry(&devices, &shapes, &queue, &wake, &dropped).await;
        }));
        Ok(wan)
    }
}

/// Reads host `i`'s packets and queues each for its destination, through `i`'s uplink.
async fn read_host(
    i: usize,
    devices: &[tun::AsyncDevice],
    shapes: &[Shape],
    queue: &Mutex<Queue>,
    wake: &Notify,
    dropped: &AtomicU64,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let Ok(n) = devices[i].recv(&mut buf).await else {
            return;
        };
        if n < 20 || buf[0] >> 4 != 4 {
            continue; // not IPv4
        }
        let to = match buf[16..20] {
            [10, 9, 0, last] if (2..2 + devices.len()).contains(&(last as usize)) => {
                last as usize - 2
            }
            _ => continue,
        };
        let shape = shapes[i];
        let now = Instant::now();
        let mut q = queue.lock().expect("queue");
        if shape.loss_pct > 0.0 && q.uniform() * 100.0 < shape.loss_pct {
            dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut free = q.up_free[i];
        let Some(sent) = serialise(&mut free, now, n, &shape) else {
            dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        q.up_free[i] = free;
        let at = sent + Duration::from_secs_f64(shape.delay_ms / 1e3);
        q.push(at, to, Stage::Down, buf[..n].to_vec());
        drop(q);
        wake.notify_one();
    }
}

/// Moves queued packets on at their times: through the receiver's downlink, then into its TUN.
async fn carry(
    devices: &[tun::AsyncDevice],
    shapes: &[Shape],
    queue: &Mutex<Queue>,
    wake: &Notify,
    dropped: &AtomicU64,
) {
    loop {
        let (due, next) = {
            let mut q = queue.lock().expect("queue");
            let now = Instant::now();
            let mut due = vec![];
            while q.events.peek().is_some_and(|e| e.at <= now) {
                let Some(e) = q.events.pop() else { break };
                match e.stage {
                    Stage::Down => {
                        let shape = shapes[e.to];
                        let mut free = q.down_free[e.to];
                        match serialise(&mut free, e.at, e.packet.len(), &shape) {
                            Some(done) => {
                                q.down_free[e.to] = free;
                                let at = done + Duration::from_secs_f64(shape.delay_ms / 1e3);
                                q.push(at, e.to, Stage::Deliver, e.packet);
                            }
                            None => {
                                dropped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Stage::Deliver => due.push(e),
                }
            }
            (due, q.events.peek().map(|e| e.at))
        };
        for e in due {
            // A full TUN queue drops the packet, as a link would.
            let _ = devices[e.to].send(&e.packet).await;
        }
        let next = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for ns in self.names.iter().rev() {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_serialises_packets_one_after_another_and_drops_past_its_buffer() {
        let shape = Shape {
            mbps: 8.0,
            delay_ms: 10.0,
            loss_pct: 0.0,
        };
        let now = Instant::now();
        let mut free = None;
        // 1,000 bytes at 8 Mbit/s: 1 ms each, queued behind each other.
        let a = serialise(&mut free, now, 1000, &shape).unwrap();
        let b = serialise(&mut free, now, 1000, &shape).unwrap();
        assert_eq!(a - now, Duration::from_millis(1));
        assert_eq!(b - now, Duration::from_millis(2));
        // Fill half a second of queue: the next packet is dropped and the link stays as it was.
        for _ in 0..499 {
            serialise(&mut free, now, 1000, &shape).unwrap();
        }
        let held = free;
        assert!(serialise(&mut free, now, 1000, &shape).is_none());
        assert_eq!(free, held);
        // An open link passes everything at once.
        let mut f = None;
        assert_eq!(serialise(&mut f, now, 1 << 20, &Shape::OPEN), Some(now));
    }
}
