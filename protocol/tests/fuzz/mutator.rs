//! A deterministic RNG and the byte-level mutator.

use nightshift_protocol::{MAX_MESSAGE_BYTES, WIRE_VERSION};

/// splitmix64: tiny, deterministic, good enough to drive a mutator.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// True with probability `pct`/100.
    pub(crate) fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }

    pub(crate) fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    pub(crate) fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// Roughly normal, mean 0, spread 1.
    pub(crate) fn normalish(&mut self) -> f32 {
        let u = (0..4)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64)
            .sum::<f64>();
        ((u - 2.0) * 1.7) as f32
    }
}

/// Bytes that make decoders take other paths: 0 and 1 (empty, false, first variant), 0x7f/0x80
/// (sign bits), 0xfa (largest one-byte varint), 0xfb..=0xfe (bincode's u16/u32/u64/u128 varint
/// markers) and 0xff.
const INTERESTING: [u8; 10] = [0, 1, 2, 0x7f, 0x80, 0xfa, 0xfb, 0xfc, 0xfd, 0xff];

/// A varint claiming a huge length or count.
fn huge_varint(rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::with_capacity(17);
    match rng.below(9) {
        0 => v.extend([0xfb, 0xff, 0xff]),
        1 => {
            v.push(0xfc);
            v.extend(u32::MAX.to_le_bytes());
        }
        2 => {
            // Just within bincode's own limit: only the frame's size can refuse it.
            v.push(0xfc);
            v.extend((MAX_MESSAGE_BYTES as u32 - 16 - rng.below(64) as u32).to_le_bytes());
        }
        3 => {
            v.push(0xfc);
            v.extend(((1u32 << 20) + rng.below(1 << 20) as u32).to_le_bytes());
        }
        4 => {
            v.push(0xfd);
            v.extend(u64::MAX.to_le_bytes());
        }
        5 => {
            v.push(0xfd);
            v.extend(((1u64 << 32) + rng.below(1 << 20) as u64).to_le_bytes());
        }
        6 => {
            v.push(0xfe);
            v.extend(u128::MAX.to_le_bytes());
        }
        7 => {
            // A non-canonical encoding of a small value.
            v.push(0xfb);
            v.extend((rng.below(251) as u16).to_le_bytes());
        }
        _ => {
            v.push(0xfc);
            v.extend((rng.next() as u32).to_le_bytes());
        }
    }
    v
}

/// Applies one to a few random mutations to `data`; `pool` is spliced from.
pub(crate) fn mutate(rng: &mut Rng, data: &mut Vec<u8>, pool: &[Vec<u8>]) {
    let rounds = if rng.chance(10) {
        2 + rng.below(8)
    } else {
        1 + rng.below(3)
    };
    for _ in 0..rounds {
        let len = data.len();
        match rng.below(13) {
            0 | 1 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            2 if len > 0 => {
                let i = rng.below(len);
                data[i] = *rng.pick(&INTERESTING);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.byte();
            }
            4 => {
                // Truncation, usually near the end.
                let cut = if rng.chance(50) {
                    len.saturating_sub(1 + rng.below(8))
                } else {
                    rng.below(len + 1)
                };
                data.truncate(cut);
            }
            5 => {
                let n = 1 + rng.below(64);
                let extra = rng.bytes(n);
                data.extend(extra);
            }
            6 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(32);
                let run: Vec<u8> = if rng.chance(50) {
                    rng.bytes(n)
                } else {
                    vec![*rng.pick(&INTERESTING); n]
                };
                data.splice(at..at, run);
            }
            7 if len > 0 => {
                let at = rng.below(len);
                let n = (1 + rng.below(32)).min(len - at);
                data.drain(at..at + n);
            }
            8 | 9 if len > 1 => {
                // Rewrite what may be a one-byte varint (length, count, variant) as a huge one.
                let at = 1 + rng.below(len - 1);
                let v = huge_varint(rng);
                data.splice(at..at + 1, v);
            }
            10 if len > 0 => {
                // Copy a run elsewhere.
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                let chunk = data[a..b].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, chunk);
            }
            11 if !pool.is_empty() && len > 0 => {
                // Splice the tail of another seed.
                let other = rng.pick(pool);
                let at = rng.below(len);
                let from = rng.below(other.len() + 1);
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
            }
            12 if len > 0 => {
                // Small arithmetic: a length off by a little.
                let i = rng.below(len);
                let d = 1 + rng.below(4) as u8;
                data[i] = if rng.chance(50) {
                    data[i].wrapping_add(d)
                } else {
                    data[i].wrapping_sub(d)
                };
            }
            _ => {
                let i = rng.below(len + 1);
                data.insert(i, rng.byte());
            }
        }
    }
}

/// A frame-level input: random bytes, a seed as is, or a mutated seed.
pub(crate) fn frame_input(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(100) {
        0..=2 => {
            let n = rng.below(300);
            rng.bytes(n)
        }
        3..=5 => {
            let n = rng.below(300);
            let mut b = vec![WIRE_VERSION];
            b.extend(rng.bytes(n));
            b
        }
        6..=10 => rng.pick(seeds).clone(),
        _ => {
            let mut b = rng.pick(seeds).clone();
            mutate(rng, &mut b, seeds);
            b
        }
    }
}
