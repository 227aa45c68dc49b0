use super::*;
use crate::machine::sliced::accept_header;
use nightshift_protocol::slices::{SlicedContribution, SlicedDelta, sign_sliced};
use nightshift_protocol::{Aggregator, DeltaCodec};

const N: usize = 3;
const LEN: usize = 1000;
const CODEC: DeltaCodec = DeltaCodec::Int4 { block: 64 };

fn key(i: usize) -> SigningKey {
    SigningKey::from_bytes(&[i as u8 + 1; 32])
}

fn rules() -> RoundSlices {
    let recipe = Recipe {
        swarm_id: Hash32::of(&[b"swarm"]),
        allowlist: Some((0..N).map(|i| key(i).verifying_key().to_bytes()).collect()),
        bootstraps: vec![],
        attest_quorum: 1,
        num_params: LEN,
        shapes: Arc::new(vec![vec![LEN]]),
        codec: CODEC,
        max_tokens: 10_000,
        aggregator: Aggregator::Mean,
        outer_lr: 0.7,
        outer_momentum: 0.7,
        slicing: None,
    };
    RoundSlices {
        recipe: Arc::new(recipe),
        round: 3,
        base_hash: Hash32::of(&[b"theta3"]),
        slicing: Slicing {
            slices: 2,
            mean_codec: DeltaCodec::Int8 { block: 64 },
        },
    }
}

/// The reduced-slice requests in `out`: (source, slice).
fn asks(out: &[Output]) -> Vec<(Key, u32)> {
    out.iter()
        .filter_map(|o| match o {
            Output::FetchReduced { from, index, .. } => Some((*from, *index)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_replay_asks_again_for_a_reduced_slice_whose_request_went_unanswered() {
    let r = rules();
    let c = r.context();
    let set: BTreeMap<Key, Accepted> = (0..N)
        .map(|i| {
            let values: Vec<f32> = (0..LEN).map(|j| (j + i) as f32 * 1e-4).collect();
            let d = SlicedDelta::encode(CODEC, &values, &c.ranges().unwrap());
            let header = SlicedContribution {
                tokens: 1000,
                inner_steps: 10,
                train_loss: 2.0,
                expected: N as u32,
                codec: CODEC,
                len: LEN as u64,
                slices: c.slices,
                root: d.root,
            };
            let env = sign_sliced(&key(i), c.swarm_id, c.round, c.base_hash, &header);
            let a = accept_header(&c, &env).unwrap();
            (a.sender, a)
        })
        .collect();
    let me = key(0);
    let holders = vec![
        key(1).verifying_key().to_bytes(),
        key(2).verifying_key().to_bytes(),
    ];
    let t0 = 10_000;
    let mut out = vec![];
    // A node replaying the round asks the claim's first holder for every slice's mean.
    let mut comb = Combining::new(
        t0,
        r.clone(),
        None,
        &set,
        me.verifying_key().to_bytes(),
        None,
        holders.clone(),
        &mut out,
    );
    assert_eq!(asks(&out), vec![(holders[0], 0), (holders[0], 1)]);
    // The holder answers for slice 0 (it has none: the next holder is asked); slice 1's
    // request is lost. Before the fetch time-out, slice 1
    // is asked of the same holder again — a lost request costs a moment, not the whole wait
    // (long enough, in a fast swarm, for the holder to forget the round).
    comb.reduced_not_found(
        t0 + 100,
        holders[0],
        0,
        me.verifying_key().to_bytes(),
        &mut out,
    );
    let mut again = vec![];
    let mut now = t0 + 100;
    while now < t0 + SLICE_FETCH_MS - 100 {
        now += 100;
        let mut o = vec![];
        comb.drive(now, &me, &holders, &mut o);
        again.extend(asks(&o).into_iter().map(|a| (now, a)));
    }
    let slice1: Vec<Millis> = again
        .iter()
        .filter(|(_, a)| *a == (holders[0], 1))
        .map(|(t, _)| *t)
        .collect();
    assert!(!slice1.is_empty(), "{again:?}");
    assert!(slice1[0] >= t0 + HEDGE_MS && slice1[0] < t0 + SLICE_FETCH_MS);
    // Slice 0 moved on to the next holder once, and is not asked of the first again.
    assert!(
        !again.iter().any(|(_, a)| *a == (holders[0], 0)),
        "{again:?}"
    );
}
