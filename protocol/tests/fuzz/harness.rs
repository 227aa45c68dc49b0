//! The harness: configuration, the panic hook, refusal reasons and the runner.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use nightshift_protocol::wire;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::mutator::Rng;

const DEFAULT_CASES: usize = 2000;
const DEFAULT_SEED: u64 = 0x6e69_6768_7473_6869;
const DEFAULT_SLOW_MS: u64 = 2000;

/// Largest frame the frame targets accept (the node's limits are of this order for everything
/// but full states).
pub(crate) const FRAME_LIMIT: usize = 1 << 20;
/// The receiver's clock in the status target.
pub(crate) const NOW_MS: u64 = 1_700_000_000_000;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

fn cases() -> usize {
    env_u64("NIGHTSHIFT_FUZZ_CASES").map_or(DEFAULT_CASES, |n| n as usize)
}

fn base_seed() -> u64 {
    env_u64("NIGHTSHIFT_FUZZ_SEED").unwrap_or(DEFAULT_SEED)
}

fn slow_limit() -> Duration {
    Duration::from_millis(env_u64("NIGHTSHIFT_FUZZ_SLOW_MS").unwrap_or(DEFAULT_SLOW_MS))
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

thread_local! {
    /// Set while a fuzz input runs: the panic hook records instead of printing.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
    static REASONS: RefCell<BTreeMap<String, u64>> = const { RefCell::new(BTreeMap::new()) };
}

fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = info.to_string());
            } else {
                default(info);
            }
        }));
    });
}

fn reasons_wanted() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("NIGHTSHIFT_FUZZ_REASONS").is_some())
}

/// Counts a refusal; with `NIGHTSHIFT_FUZZ_REASONS` set, by its reason (numbers elided), which
/// the summary then lists: how deep the inputs get.
pub(crate) fn refused(e: impl std::fmt::Debug) -> bool {
    if reasons_wanted() {
        // Words holding a digit (numbers, hashes) become '#', so that reasons group.
        let text = format!("{e:?}");
        let mut key = String::new();
        let mut word = String::new();
        for c in text.chars().chain([' ']) {
            if c.is_ascii_alphanumeric() {
                word.push(c);
                continue;
            }
            if word.bytes().any(|b| b.is_ascii_digit()) {
                key.push('#');
            } else {
                key.push_str(&word);
            }
            word.clear();
            key.push(c);
        }
        key.truncate(key.floor_char_boundary(90));
        REASONS.with(|r| *r.borrow_mut().entry(key).or_default() += 1);
    }
    false
}

pub(crate) fn hex(b: &[u8]) -> String {
    hex::encode(b)
}

/// Peak virtual memory of the process (Linux), for the summary line.
fn vm_peak_mib() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmPeak:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or_else(|| "n/a".into(), |kb| format!("{} MiB", kb / 1024))
}

/// Runs `cases()` inputs from `generate` through `check` (true: decoded, false: refused), each inside
/// `catch_unwind`, prints the summary line and fails on a panic or a slow input.
pub(crate) fn fuzz<I>(
    target: &str,
    mut generate: impl FnMut(&mut Rng) -> I,
    show: impl Fn(&I) -> String,
    check: impl Fn(&I) -> bool,
) {
    install_quiet_hook();
    let n = cases();
    let seed = base_seed();
    let mut rng = Rng(seed ^ fnv1a(target));
    let (mut ok, mut err, mut panics) = (0u64, 0u64, 0u64);
    let mut first_panic: Option<(String, String)> = None;
    let mut slowest = (Duration::ZERO, String::new());
    let started = Instant::now();
    for _ in 0..n {
        let input = generate(&mut rng);
        QUIET.with(|q| q.set(true));
        let t = Instant::now();
        let r = panic::catch_unwind(AssertUnwindSafe(|| check(&input)));
        let dt = t.elapsed();
        QUIET.with(|q| q.set(false));
        match r {
            Ok(true) => ok += 1,
            Ok(false) => err += 1,
            Err(_) => {
                panics += 1;
                if first_panic.is_none() {
                    let msg = LAST_PANIC.with(|p| p.borrow().clone());
                    first_panic = Some((show(&input), msg));
                }
            }
        }
        if dt > slowest.0 {
            slowest = (dt, show(&input));
        }
    }
    println!(
        "fuzz {target}: {n} inputs, {ok} decoded, {err} refused, {panics} panics \
         (seed {seed:#x}, {:.1} s, slowest input {:.2} ms, vm peak {})",
        started.elapsed().as_secs_f64(),
        slowest.0.as_secs_f64() * 1e3,
        vm_peak_mib(),
    );
    let mut reasons: Vec<(String, u64)> = REASONS
        .with(|r| std::mem::take(&mut *r.borrow_mut()))
        .into_iter()
        .collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
    for (why, count) in reasons {
        println!("  {target} refused {count}: {why}");
    }
    if let Some((input, msg)) = &first_panic {
        println!("fuzz {target}: first panicking input: {input}\n  {msg}");
    }
    assert_eq!(
        panics,
        0,
        "{target}: first panicking input: {}",
        first_panic
            .map(|(i, m)| format!("{i}\n{m}"))
            .unwrap_or_default()
    );
    assert!(
        slowest.0 < slow_limit(),
        "{target}: an input took {:?}: {}",
        slowest.0,
        slowest.1
    );
}

/// A decoded value re-encodes to a frame that decodes to the same encoding.
pub(crate) fn assert_stable<T: Serialize + DeserializeOwned>(v: &T, limit: usize) {
    let re = wire::encode(v);
    let back: T = wire::decode(&re, limit).expect("a decoded value's encoding decodes");
    assert_eq!(wire::encode(&back), re, "re-encoding is stable");
}
