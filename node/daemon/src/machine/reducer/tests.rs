use super::*;
use crate::machine::accept::Accepted;
use crate::machine::sliced::sliced_round_step;
use nightshift_protocol::slices::{SlicedContribution, SlicedDelta, sign_sliced};
use nightshift_protocol::{Aggregator, DeltaCodec, delta};

pub(crate) const N: usize = 5;
const LEN: usize = 1000;
const CODEC: DeltaCodec = DeltaCodec::Int4 { block: 64 };

pub(crate) fn key(i: usize) -> SigningKey {
    SigningKey::from_bytes(&[i as u8 + 1; 32])
}

pub(crate) fn rules(aggregator: Aggregator) -> RoundSlices {
    let recipe = Recipe {
        swarm_id: Hash32::of(&[b"swarm"]),
        allowlist: Some((0..N).map(|i| key(i).verifying_key().to_bytes()).collect()),
        bootstraps: vec![],
        attest_quorum: 1,
        num_params: LEN,
        shapes: Arc::new(vec![vec![LEN]]),
        codec: CODEC,
        max_tokens: 10_000,
        aggregator,
        outer_lr: 0.7,
        outer_momentum: 0.7,
        slicing: None,
    };
    RoundSlices {
        recipe: Arc::new(recipe),
        round: 3,
        base_hash: Hash32::of(&[b"theta3"]),
        slicing: Slicing {
            slices: 3,
            mean_codec: DeltaCodec::Int8 { block: 64 },
        },
    }
}

fn delta_of(i: usize) -> Vec<f32> {
    (0..LEN)
        .map(|j| ((j * 3 + i * 17) as f32 * 0.21).sin() * 1e-2 + 2e-3)
        .collect()
}

/// Contributor `i`'s signed header and slices.
pub(crate) fn contribute(r: &RoundSlices, i: usize) -> (SignedEnvelope, SlicedDelta) {
    let c = r.context();
    let d = SlicedDelta::encode(CODEC, &delta_of(i), &c.ranges().unwrap());
    let header = SlicedContribution {
        tokens: 1000 + 100 * i as u64,
        inner_steps: 10,
        train_loss: 2.0,
        expected: N as u32,
        codec: CODEC,
        len: LEN as u64,
        slices: c.slices,
        root: d.root,
    };
    let env = sign_sliced(&key(i), c.swarm_id, c.round, c.base_hash, &header);
    (env, d)
}

/// Reducer and second reducer of slice `j`.
fn reducers_of(j: usize) -> [usize; 2] {
    [j, (j + 1) % N]
}

#[test]
fn a_reduce_scatter_round_checked_at_every_hop_takes_the_sliced_step_bit_for_bit() {
    for agg in [Aggregator::Mean, Aggregator::ROBUST] {
        let r = rules(agg);
        let s = r.slicing.slices as usize;
        let sent: Vec<_> = (0..N).map(|i| contribute(&r, i)).collect();
        let mut reducers: Vec<[Reducer; 2]> = (0..s)
            .map(|j| {
                [
                    Reducer::new(r.clone(), j as u32),
                    Reducer::new(r.clone(), j as u32),
                ]
            })
            .collect();
        for (env, d) in &sent {
            for (j, pair) in reducers.iter_mut().enumerate() {
                for red in pair.iter_mut() {
                    assert_eq!(red.offer(&d.slice(env, j)), Ok(true));
                    // The same slice again is taken as held already.
                    assert_eq!(red.offer(&d.slice(env, j)), Ok(false));
                }
            }
        }
        let mut nodes: Vec<Combiner> = (0..N).map(|_| Combiner::new(r.clone())).collect();
        for (j, [first, second]) in reducers.iter().enumerate() {
            let [a, b] = reducers_of(j);
            let (payload, inputs) = first.reduce(None).unwrap();
            let signed = [
                first.sign(&key(a), &payload),
                second.check(&key(b), &payload, &inputs).unwrap(),
            ];
            let keys = [a, b].map(|k| key(k).verifying_key().to_bytes());
            let checked = CheckedInputs::new(inputs, &r.context()).unwrap();
            for node in &mut nodes {
                assert_eq!(node.offer(&signed, &keys, &checked), Ok(j as u32));
            }
        }
        // Every node takes one step, the one averaging the whole contributions slice by slice
        // takes.
        let accepted: BTreeMap<Key, Accepted> = sent
            .iter()
            .map(|(env, _)| {
                let h: SlicedContribution = wire::decode(&env.payload, 256).unwrap();
                let i = (0..N)
                    .find(|i| key(*i).verifying_key().to_bytes() == env.header.sender)
                    .unwrap();
                let whole = delta::decode(&delta::encode(CODEC, &delta_of(i)), LEN).unwrap();
                let a = Accepted {
                    sender: env.header.sender,
                    digest: env.digest(),
                    tokens: h.tokens,
                    train_loss: h.train_loss,
                    delta: whole,
                    expected: h.expected,
                };
                (a.sender, a)
            })
            .collect();
        let want = sliced_round_step(&accepted, Some(0.3), agg, CODEC, r.slicing).unwrap();
        for node in &nodes {
            let (step, formed) = node.step(Some(0.3)).unwrap();
            assert_eq!(step, want, "{agg}");
            assert_eq!(formed.len(), N);
            assert!(
                formed
                    .iter()
                    .all(|id| accepted[&id.sender].digest == id.digest)
            );
        }
    }
}

#[test]
fn a_lying_reducer_a_missing_input_or_a_lone_signature_is_caught() {
    let r = rules(Aggregator::Mean);
    let sent: Vec<_> = (0..N).map(|i| contribute(&r, i)).collect();
    let (mut first, mut second) = (Reducer::new(r.clone(), 0), Reducer::new(r.clone(), 0));
    for (env, d) in &sent {
        first.offer(&d.slice(env, 0)).unwrap();
    }
    for (env, d) in &sent[..N - 1] {
        second.offer(&d.slice(env, 0)).unwrap();
    }
    // The checker lacks one input: it cannot vouch for the full average...
    let (full, all) = first.reduce(None).unwrap();
    assert!(second.check(&key(1), &full, &all).is_err());
    // ...but checks one over the inputs it holds, and refuses it changed.
    let ids: Vec<ContributionId> = second.held().collect();
    let (fair, inputs) = first.reduce(Some(&ids)).unwrap();
    assert!(second.check(&key(1), &fair, &inputs).is_ok());
    let mut lie = fair.clone();
    lie.mean = delta::encode(r.slicing.mean_codec, &vec![0.5; lie.mean.len as usize]);
    assert!(
        second
            .check(&key(1), &lie, &inputs)
            .unwrap_err()
            .contains("differs")
    );
    let mut more = inputs.clone();
    more[0].tokens += 1;
    let lie = ReducedSlice {
        inputs: nightshift_protocol::slices::inputs_digest(&more),
        ..fair.clone()
    };
    assert!(second.check(&key(1), &lie, &more).is_err());

    // Slices for another reducer, a second contribution by a sender, a tampered slice: refused.
    let (env, d) = &sent[0];
    assert!(matches!(
        first.offer(&d.slice(env, 1)),
        Err(Refused::OtherSlice { .. })
    ));
    let other = SlicedDelta::encode(CODEC, &delta_of(9), &r.context().ranges().unwrap());
    let mut h: SlicedContribution = wire::decode(&env.payload, 256).unwrap();
    h.root = other.root;
    let c = r.context();
    let env2 = sign_sliced(&key(0), c.swarm_id, c.round, c.base_hash, &h);
    assert_eq!(
        first.offer(&other.slice(&env2, 0)),
        Err(Refused::Equivocation)
    );
    let mut fresh = Reducer::new(r.clone(), 0);
    let mut bad = d.slice(env, 0);
    bad.body.body[0] ^= 1;
    assert!(matches!(
        fresh.offer(&bad),
        Err(Refused::Slice(SliceError::BadPath(0)))
    ));
    assert_eq!(fresh.held().count(), 0);

    // A node takes a reduced slice only with both its reducers' signatures, and steps only
    // once every slice is in.
    let mut node = Combiner::new(r.clone());
    let keys = [0, 1].map(|k| key(k).verifying_key().to_bytes());
    let checked = CheckedInputs::new(inputs.clone(), &r.context()).unwrap();
    let one = [first.sign(&key(0), &fair)];
    assert!(node.offer(&one, &keys, &checked).is_err());
    let forged = [first.sign(&key(0), &fair), first.sign(&key(2), &fair)];
    assert!(node.offer(&forged, &keys, &checked).is_err());
    let good = [
        first.sign(&key(0), &fair),
        second.check(&key(1), &fair, &inputs).unwrap(),
    ];
    let other = CheckedInputs::new(all.clone(), &r.context()).unwrap();
    assert!(
        node.offer(&good, &keys, &other).is_err(),
        "another input list"
    );
    assert_eq!(node.offer(&good, &keys, &checked), Ok(0));
    assert!(node.has_inputs(&fair.inputs));
    assert_eq!(node.missing(), vec![1, 2]);
    assert!(node.step(None).is_none());
}

/// Bytes each node sends and receives in a reduce-scatter round of `n` nodes over a model of
/// `len` values, every message encoded as it would travel: node j reduces slice j and checks
/// slice j − 1; the reducer sends its payload to the checker, which returns its signature; the
/// reducer sends both to every other node. Returns (most up, most down, one whole contribution
/// as all-to-all sends it).
fn round_bytes(n: usize, len: usize) -> (usize, usize, usize) {
    let keys: Vec<SigningKey> = (0..n)
        .map(|i| SigningKey::from_bytes(&[i as u8 + 1; 32]))
        .collect();
    let recipe = Recipe {
        allowlist: Some(keys.iter().map(|k| k.verifying_key().to_bytes()).collect()),
        num_params: len,
        shapes: Arc::new(vec![vec![len]]),
        ..(*rules(Aggregator::Mean).recipe).clone()
    };
    let r = RoundSlices {
        recipe: Arc::new(recipe),
        slicing: Slicing {
            slices: n as u32,
            mean_codec: DeltaCodec::Int8 { block: 64 },
        },
        ..rules(Aggregator::Mean)
    };
    let c = r.context();
    let (mut up, mut down) = (vec![0usize; n], vec![0usize; n]);
    let mut reducers: Vec<Reducer> = (0..n).map(|j| Reducer::new(r.clone(), j as u32)).collect();
    let mut whole = 0;
    for (i, k) in keys.iter().enumerate() {
        // Pseudo-random values: as little for zstd to find as in a real delta.
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
        let values: Vec<f32> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-2
            })
            .collect();
        let d = SlicedDelta::encode(CODEC, &values, &c.ranges().unwrap());
        let header = SlicedContribution {
            tokens: 1000,
            inner_steps: 10,
            train_loss: 2.0,
            expected: n as u32,
            codec: CODEC,
            len: len as u64,
            slices: c.slices,
            root: d.root,
        };
        let env = sign_sliced(k, c.swarm_id, c.round, c.base_hash, &header);
        for (j, red) in reducers.iter_mut().enumerate() {
            let s = d.slice(&env, j);
            let bytes = wire::encode(&s).len();
            for to in [j, (j + 1) % n] {
                if to != i {
                    up[i] += bytes;
                    down[to] += bytes;
                }
            }
            red.offer(&s).unwrap();
        }
        if i == 0 {
            let contribution = nightshift_protocol::Contribution {
                tokens: 1000,
                inner_steps: 10,
                train_loss: 2.0,
                delta: delta::encode(CODEC, &values),
                expected: n as u32,
            };
            let header = nightshift_protocol::signed::EnvelopeHeader {
                kind: nightshift_protocol::PayloadKind::Contribution,
                swarm_id: c.swarm_id,
                round: c.round,
                sender: [0; 32],
                base_hash: c.base_hash,
            };
            let env = SignedEnvelope::sign(k, header, wire::encode(&contribution));
            whole = wire::encode(&nightshift_protocol::Request::Push(env)).len();
        }
    }
    for (j, red) in reducers.iter().enumerate() {
        let checker = (j + 1) % n;
        let (payload, inputs) = red.reduce(None).unwrap();
        let signed = red.sign(&keys[j], &payload);
        let cosign = red.check(&keys[checker], &payload, &inputs).unwrap();
        if j == 0 {
            // Every reducer counts everyone: each node fetches the one list once.
            let list = wire::encode(&nightshift_protocol::slices::ReducedInputs(inputs)).len();
            up[0] += list * (n - 1);
            down.iter_mut().skip(1).for_each(|d| *d += list);
        }
        let (full, sig) = (
            wire::encode(&signed).len(),
            wire::encode(&cosign).len() - cosign.payload.len(),
        );
        if checker != j {
            up[j] += full;
            down[checker] += full;
            up[checker] += sig;
            down[j] += sig;
        }
        for to in (0..n).filter(|t| *t != j) {
            up[j] += full + sig;
            down[to] += full + sig;
        }
    }
    (
        *up.iter().max().unwrap(),
        *down.iter().max().unwrap(),
        whole,
    )
}

#[test]
fn a_nodes_bytes_per_round_stay_flat_as_the_swarm_grows() {
    let len = 200_000;
    let (up4, down4, c) = round_bytes(4, len);
    let (up16, down16, _) = round_bytes(16, len);
    println!(
        "one contribution {c} B; n=4: up {up4} down {down4}; n=16: up {up16} down {down16} \
         (all-to-all: {} and {})",
        3 * c,
        15 * c
    );
    assert!(up16 * 2 <= up4 * 3 && down16 * 2 <= down4 * 3, "not flat");
    // A few contributions' worth each way, where all-to-all at 16 sends fifteen.
    assert!(up16 < 5 * c && down16 < 5 * c);
}
