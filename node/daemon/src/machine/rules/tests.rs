use super::*;
use nightshift_protocol::NodeRole;
use nightshift_protocol::message::Phase;
use nightshift_protocol::message::formed_root;

fn recipe(members: Option<Vec<[u8; 32]>>, quorum: u32) -> Recipe {
    Recipe {
        swarm_id: Hash32::default(),
        allowlist: members,
        bootstraps: vec![[0xB0; 32]],
        attest_quorum: quorum,
        num_params: 4,
        shapes: Arc::new(vec![vec![4]]),
        codec: DeltaCodec::Fp32,
        max_tokens: 100,
        aggregator: Aggregator::Mean,
        outer_lr: 0.7,
        outer_momentum: 0.7,
        slicing: None,
    }
}

fn claim(round: u64, tag: &[u8], formed: usize, signers: &[[u8; 32]]) -> Claim {
    let ids: Vec<ContributionId> = (1..=formed as u8)
        .map(|i| ContributionId {
            sender: [i; 32],
            digest: Hash32::of(&[&[i]]),
        })
        .collect();
    Claim {
        round,
        hash: Hash32::of(&[tag]),
        formed,
        formed_root: formed_root(&ids),
        formed_by: Some(ids),
        holders: signers.to_vec(),
        signers: signers.to_vec(),
    }
}

fn held(round: u64, formed: usize) -> Held<'static> {
    Held {
        round,
        hash: Hash32::of(&[b"ours"]),
        formed,
        attested: true,
        chain: &[],
    }
}

fn contribution(key: u8, round: u64, base_hash: Hash32, values: &[f32]) -> Arc<SignedEnvelope> {
    use nightshift_protocol::signed::EnvelopeHeader;
    use nightshift_protocol::{Contribution, PayloadKind, delta, wire};
    let c = Contribution {
        tokens: 50,
        inner_steps: 5,
        train_loss: 1.0,
        delta: delta::encode(DeltaCodec::Fp32, values),
        expected: 2,
    };
    let h = EnvelopeHeader {
        kind: PayloadKind::Contribution,
        swarm_id: Hash32::default(),
        round,
        sender: [0; 32],
        base_hash,
    };
    let k = ed25519_dalek::SigningKey::from_bytes(&[key; 32]);
    Arc::new(SignedEnvelope::sign(&k, h, wire::encode(&c)))
}

#[test]
fn a_replayed_round_verifies_only_the_state_its_contributions_form() {
    let r = recipe(None, 0);
    let base = StateSnapshot {
        round: 3,
        params: vec![1.0, 2.0, 3.0, 4.0],
        momentum: vec![0.1; 4],
        formed_by: vec![],
        noise: None,
    };
    let bh = base.hash();
    let envs = vec![
        contribution(1, 3, bh, &[0.1, 0.0, -0.1, 0.2]),
        contribution(2, 3, bh, &[0.3, 0.1, 0.0, 0.0]),
    ];
    // The honest result, as a node computes its own round.
    let ctx = r.context(3, bh);
    let set: BTreeMap<[u8; 32], Accepted> = envs
        .iter()
        .map(|e| {
            let a = accept(&ctx, e).unwrap();
            (a.sender, a)
        })
        .collect();
    let (honest, _) = r.apply(&base, &set).unwrap();
    let ok = replay_round(&r, &base, bh, envs.clone(), honest.hash()).unwrap();
    assert_eq!(ok.state, honest);
    assert_eq!(ok.state.formed_by.len(), 2);
    // A made-up state (all zeros) is not what these contributions form.
    let forged = StateSnapshot {
        round: 4,
        params: vec![0.0; 4],
        momentum: vec![0.0; 4],
        formed_by: honest.formed_by.clone(),
        noise: None,
    };
    assert!(matches!(
        replay_round(&r, &base, bh, envs.clone(), forged.hash()),
        Err(ReplayError::Mismatch { .. })
    ));
    // The state names each contribution by its digest: a sender that signed two different
    // contributions for the round (equivocation) cannot have its other one stand in.
    let mut ids: Vec<ContributionId> = envs.iter().map(|e| ContributionId::of(e)).collect();
    ids.sort_unstable();
    assert_eq!(ok.state.formed_by, ids);
    let other = vec![
        envs[0].clone(),
        contribution(2, 3, bh, &[0.3, 0.1, 0.0, 0.5]),
    ];
    assert_eq!(other[1].header.sender, envs[1].header.sender);
    assert!(matches!(
        replay_round(&r, &base, bh, other, honest.hash()),
        Err(ReplayError::Mismatch { .. })
    ));
    // The genesis relabelled as a later round is not either.
    let mut relabelled = base.clone();
    relabelled.round = 4;
    assert!(replay_round(&r, &base, bh, envs.clone(), relabelled.hash()).is_err());
    // A contribution bound to another base state is refused, whatever the claim — as a state
    // built on another base than ours, which is not the claim's fault (we diverged earlier).
    let stale = vec![
        envs[0].clone(),
        contribution(3, 3, Hash32::of(&[b"other"]), &[1.0; 4]),
    ];
    let e = replay_round(&r, &base, bh, stale, honest.hash()).err();
    assert!(matches!(e, Some(ReplayError::OtherBase { .. })), "{e:?}");
    assert!(!e.is_some_and(|e| e.is_fault()));
    assert!(matches!(
        Err::<(), _>(ReplayError::Empty),
        Err(ReplayError::Empty)
    ));
    // So is one of an outsider in a swarm with an allowlist.
    let private = recipe(Some(vec![envs[0].header.sender]), 1);
    assert!(matches!(
        replay_round(&private, &base, bh, envs, honest.hash()),
        Err(ReplayError::Refused { .. })
    ));
}

#[test]
fn a_state_formed_by_more_contributions_is_preferred_then_the_smaller_hash() {
    let (a, b) = (Hash32::of(&[b"a"]), Hash32::of(&[b"b"]));
    assert_eq!(preferred((3, a), (2, b)), Ordering::Less);
    assert_eq!(preferred((2, a), (3, b)), Ordering::Greater);
    assert_eq!(preferred((2, a), (2, b)), a.cmp(&b));
}

#[test]
fn an_outsiders_or_lone_members_far_future_claim_is_not_attested() {
    let members = vec![[1; 32], [2; 32], [3; 32], [4; 32]];
    let r = recipe(Some(members), 2);
    let lone = claim(50, b"x", 1, &[[1; 32]]);
    let outsider = claim(50, b"x", 1, &[[9; 32], [8; 32], [7; 32]]);
    let two = claim(50, b"x", 3, &[[1; 32], [2; 32]]);
    let twice = claim(50, b"x", 3, &[[1; 32], [1; 32]]);
    let boot = claim(50, b"x", 3, &[[0xB0; 32]]);
    assert!(!r.attested(&lone));
    assert!(!r.attested(&outsider));
    assert!(r.attested(&two));
    assert!(!r.attested(&twice), "one member counted once");
    assert!(r.attested(&boot));
    // An open swarm: any number of member signatures attest nothing; a bootstrap does.
    let open = recipe(None, 0);
    assert!(!open.attested(&outsider));
    assert!(open.attested(&boot));
    // Far ahead, only attested claims are candidates.
    let c = candidates(
        &r,
        held(3, 3),
        &[lone.clone(), two.clone()],
        &Rejections::default(),
    );
    assert_eq!(c, vec![Candidate::Attested(two)]);
}

#[test]
fn candidates_put_forks_first_then_one_round_ahead_then_attested_far() {
    let r = recipe(Some(vec![[1; 32], [2; 32], [3; 32]]), 1);
    let ours = held(5, 2);
    let smaller_fork = claim(5, b"f1", 1, &[[1; 32]]);
    let bigger_fork = claim(5, b"f2", 3, &[[2; 32]]);
    let next_small = claim(6, b"n1", 1, &[[9; 32]]);
    let next_big = claim(6, b"n2", 3, &[[9; 32]]);
    let far = claim(9, b"far", 3, &[[3; 32]]);
    let all = [
        smaller_fork.clone(),
        next_small.clone(),
        far.clone(),
        bigger_fork.clone(),
        next_big.clone(),
    ];
    let c = candidates(&r, ours, &all, &Rejections::default());
    assert_eq!(
        c,
        vec![
            Candidate::Fork(bigger_fork.clone()),
            Candidate::Ahead(next_big.clone()),
            Candidate::Ahead(next_small.clone()),
            Candidate::Attested(far.clone()),
        ]
    );
    // However many members sign a fork or the next round, it is replayed, never taken on
    // their word: only a claim too far ahead to replay can be attested.
    assert!(
        c.iter()
            .all(|x| !matches!(x, Candidate::Attested(a) if a.round <= ours.round + 1))
    );
    // A claim that failed to verify is not tried again.
    let mut rejected = Rejections::default();
    rejected.note(&next_big, true, 0);
    let c = candidates(&r, ours, &all, &rejected);
    assert!(
        !c.contains(&Candidate::Ahead(next_big)),
        "rejected claims are skipped"
    );
    // So are other claims signed only by peers whose claims failed: a peer inventing a new
    // state every second costs one verification per REJECT_SECS.
    assert!(!c.contains(&Candidate::Ahead(next_small)), "{c:?}");
    assert!(c.contains(&Candidate::Attested(far)));
}

#[test]
fn between_two_chains_the_attested_one_is_a_candidate_and_only_while_ours_is_not_attested() {
    let open = recipe(None, 0);
    let boot = [0xB0; 32];
    // Ours: round 5, formed by 3, our chain's round 4 was "ours4".
    let chain = [(4, Hash32::of(&[b"ours4"])), (5, Hash32::of(&[b"ours"]))];
    let ours = Held {
        round: 5,
        hash: Hash32::of(&[b"ours"]),
        formed: 3,
        attested: false,
        chain: &chain,
    };
    // The bootstrap holds a lesser state of our round: the rules would not prefer it.
    let lesser = claim(5, b"boot5", 1, &[boot]);
    // ... or a state of the round before that is not the one ours was formed from.
    let behind = claim(4, b"boot4", 1, &[boot]);
    // ... or the very state ours was formed from: our chain, a round behind.
    let same = Claim {
        hash: Hash32::of(&[b"ours4"]),
        ..claim(4, b"x", 1, &[boot])
    };
    // A lesser state of our round nobody attests is nothing to us (as before).
    let unattested = claim(5, b"peer5", 1, &[[7; 32]]);
    let all = [lesser.clone(), behind.clone(), same, unattested];
    let c = candidates(&open, ours, &all, &Rejections::default());
    assert_eq!(
        c,
        vec![
            Candidate::Cross(lesser.clone()),
            Candidate::Cross(behind.clone())
        ]
    );
    // Once ours is attested (the bootstrap holds it too), preference alone decides again.
    let attested = Held {
        attested: true,
        ..ours
    };
    assert!(candidates(&open, attested, &all, &Rejections::default()).is_empty());
    // A round further back than the chain we remember is left alone.
    let old = claim(2, b"boot2", 1, &[boot]);
    assert!(candidates(&open, ours, &[old], &Rejections::default()).is_empty());
    // In a private swarm the quorum attests: one member's lesser state is no candidate,
    // two members' is.
    let members: Vec<[u8; 32]> = (1..=4).map(|i| [i; 32]).collect();
    let private = recipe(Some(members), 2);
    let one = claim(5, b"one", 1, &[[1; 32]]);
    let two = claim(5, b"two", 1, &[[1; 32], [2; 32]]);
    let c = candidates(&private, ours, &[one, two.clone()], &Rejections::default());
    assert_eq!(c, vec![Candidate::Cross(two)]);
    // Held::attested is what a node computes for its own state with the same rule.
    assert!(private.attested_by(&[[3; 32], [4; 32]]));
    assert!(!private.attested_by(&[[3; 32], [3; 32]]));
    assert!(open.attested_by(&[[9; 32], boot]));
}

#[test]
fn statuses_group_into_claims_by_root_and_a_claim_takes_the_list_of_any_holder() {
    let peers: Vec<[u8; 32]> = (1..=4u8).map(|i| [i; 32]).collect();
    let id = |i: u8| ContributionId {
        sender: [i; 32],
        digest: Hash32::of(&[&[i]]),
    };
    let st = |lists: &StatusLists| {
        Status::summarizing(
            NodeRole::Trainer,
            Phase::Ready,
            4,
            Hash32::of(&[b"h"]),
            lists,
        )
    };
    let lists = |ids: Vec<ContributionId>| StatusLists {
        formed_by: ids,
        holding: vec![],
    };
    let (l21, l12, l13) = (
        lists(vec![id(2), id(1)]),
        lists(vec![id(1), id(2)]),
        lists(vec![id(1), id(3)]),
    );
    let (a, b, c) = (st(&l21), st(&l12), st(&l13));
    // One peer sent no lists, another the same set in another order; a third holds the same
    // state formed by another set.
    let claims = group_claims([
        (peers[0], &a, None),
        (peers[1], &b, Some(&l12)),
        (peers[2], &c, None),
    ]);
    assert_eq!(claims.len(), 2, "{claims:?}");
    assert_eq!(claims[0].holders, vec![peers[0], peers[1]]);
    assert_eq!(claims[0].formed, 2);
    assert_eq!(claims[0].formed_by, Some(vec![id(1), id(2)]));
    assert_eq!(
        (claims[1].holders.clone(), claims[1].formed_by.as_ref()),
        (vec![peers[2]], None)
    );
    // Without any lists, a claim is still grouped and counted.
    let claims = group_claims([(peers[0], &a, None), (peers[1], &b, None)]);
    assert_eq!(claims.len(), 1);
    assert_eq!((claims[0].formed, claims[0].formed_by.as_ref()), (2, None));
}

#[test]
fn round_zero_is_cut_for_the_members_or_into_a_fixed_count_not_into_one_slice() {
    let sliced = |members: Option<Vec<[u8; 32]>>| Recipe {
        num_params: 4096,
        shapes: Arc::new(vec![vec![4096]]),
        slicing: Some(Slicing {
            slices: 0,
            mean_codec: DeltaCodec::Fp32,
        }),
        ..recipe(members, 0)
    };
    let state = |formed: usize| StateSnapshot {
        round: u64::from(formed > 0),
        params: vec![0.0; 4096],
        momentum: vec![0.0; 4096],
        formed_by: (0..formed as u8)
            .map(|i| ContributionId {
                sender: [i; 32],
                digest: Hash32::of(&[&[i]]),
            })
            .collect(),
        noise: None,
    };
    let slices = |r: &Recipe, s: &StateSnapshot| r.round_slicing(s).map(|s| s.slices);
    // Round 0 has no contributors to count: a private swarm cuts it for its members, an open
    // one into FIRST_ROUND_SLICES; later rounds for the contributors that formed their base.
    let private = sliced(Some((1..=5).map(|i| [i; 32]).collect()));
    assert_eq!(slices(&private, &state(0)), Some(5));
    assert_eq!(slices(&private, &state(3)), Some(3));
    let open = sliced(None);
    assert_eq!(slices(&open, &state(0)), Some(FIRST_ROUND_SLICES as u32));
    assert_eq!(slices(&open, &state(7)), Some(7));
    // A recipe that names a count keeps it; one that averages whole contributions cuts none.
    let fixed = Recipe {
        slicing: Some(Slicing {
            slices: 2,
            mean_codec: DeltaCodec::Fp32,
        }),
        ..sliced(None)
    };
    assert_eq!(slices(&fixed, &state(0)), Some(2));
    assert_eq!(slices(&recipe(None, 0), &state(0)), None);
}

#[test]
fn an_open_swarm_with_reducers_counts_more_contributors_as_its_rounds_have_more_slices() {
    let sliced = |members: Option<Vec<[u8; 32]>>| Recipe {
        num_params: 1 << 20,
        shapes: Arc::new(vec![vec![1 << 20]]),
        slicing: Some(Slicing {
            slices: 0,
            mean_codec: DeltaCodec::Fp32,
        }),
        ..recipe(members, 0)
    };
    let state = |formed: usize| StateSnapshot {
        round: u64::from(formed > 0),
        params: vec![],
        momentum: vec![],
        formed_by: (0..formed)
            .map(|i| ContributionId {
                sender: Hash32::of(&[&i.to_le_bytes()]).0,
                digest: Hash32::default(),
            })
            .collect(),
        noise: None,
    };
    let open = sliced(None);
    // Every node holds every contribution whole: 256 a round.
    assert_eq!(recipe(None, 0).round_max_contributors(&state(0)), 256);
    // With reducers: 128 a slice, so round 0 (16 slices) counts 2,048, and a round after 300
    // contributors (300 slices) the most any round may (4,096).
    assert_eq!(open.round_max_contributors(&state(0)), 2048);
    assert_eq!(open.round_max_contributors(&state(300)), 4096);
    assert_eq!(open.max_contributors(), 4096);
    // A round after a single contributor still counts what a round of whole contributions does.
    assert_eq!(open.round_max_contributors(&state(1)), 256);
    // A private swarm: its members, however it averages.
    let private = sliced(Some((1..=5).map(|i| [i; 32]).collect()));
    assert_eq!(private.round_max_contributors(&state(0)), 5);
}
