//! Statuses: what a node says of itself — signed, bound to its round and state, fresh — and the
//! lists a status commits to.

use serde::{Deserialize, Serialize};

use crate::message::{ContributionId, MAX_EXPECTED, NodeRole, Phase};
use crate::{Hash32, SignedEnvelope};

/// A node's view of itself, sent on every phase change and on request. It is small whatever
/// the swarm's size: the lists behind it (which contributions formed the state, which ones the
/// node holds) are only counted and committed to by a root here, and travel on request
/// ([`StatusLists`], [`crate::Request::GetStatusLists`]) when a peer needs them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub role: NodeRole,
    pub phase: Phase,
    /// The round being worked on: the node holds θ(round).
    pub round: u64,
    /// Hash of θ(round) and the outer-optimizer state ([`crate::StateSnapshot::hash`]).
    pub state_hash: Hash32,
    /// How many contributions formed θ(round) (0 for round 0), and the root of their ids
    /// ([`formed_root`]).
    pub formed: u32,
    pub formed_root: Hash32,
    /// How many verified contributions for `round` this node holds so far, and the root of
    /// their senders ([`holding_root`]).
    pub holding: u32,
    pub holding_root: Hash32,
    /// When the status was signed (Unix milliseconds): a receiver refuses one from too far in
    /// the past or future ([`MAX_STATUS_SKEW_MS`]), or older than one it already holds from the
    /// same sender.
    pub unix_ms: u64,
}

impl Status {
    /// The status that summarizes `lists` (`unix_ms` left for the signer to set).
    pub fn summarizing(
        role: NodeRole,
        phase: Phase,
        round: u64,
        state_hash: Hash32,
        lists: &StatusLists,
    ) -> Status {
        Status {
            role,
            phase,
            round,
            state_hash,
            formed: lists.formed_by.len() as u32,
            formed_root: formed_root(&lists.formed_by),
            holding: lists.holding.len() as u32,
            holding_root: holding_root(&lists.holding),
            unix_ms: 0,
        }
    }
}

/// The lists a [`Status`] commits to: the contributions that formed θ(round) (in key order,
/// one per sender) and the senders whose contributions for `round` the node holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusLists {
    pub formed_by: Vec<ContributionId>,
    pub holding: Vec<[u8; 32]>,
}

impl StatusLists {
    /// Whether these are the lists `status` commits to: the same counts and roots, and no
    /// sender named twice.
    pub fn matches(&self, status: &Status) -> bool {
        let mut senders: Vec<[u8; 32]> = self.formed_by.iter().map(|c| c.sender).collect();
        senders.sort_unstable();
        senders.dedup();
        self.formed_by.len() <= MAX_LISTED
            && self.holding.len() <= MAX_LISTED
            && senders.len() == self.formed_by.len()
            && self.formed_by.len() == status.formed as usize
            && self.holding.len() == status.holding as usize
            && formed_root(&self.formed_by) == status.formed_root
            && holding_root(&self.holding) == status.holding_root
    }
}

/// The root of a set of contribution ids, whatever their order.
pub fn formed_root(ids: &[ContributionId]) -> Hash32 {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    let mut parts: Vec<&[u8]> = vec![b"nightshift/formed/v1"];
    for id in &ids {
        parts.push(&id.sender);
        parts.push(&id.digest.0);
    }
    Hash32::of(&parts)
}

/// The root of a set of senders, whatever their order.
pub fn holding_root(keys: &[[u8; 32]]) -> Hash32 {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    let mut parts: Vec<&[u8]> = vec![b"nightshift/holding/v1"];
    for k in &keys {
        parts.push(k);
    }
    Hash32::of(&parts)
}

/// Largest number of senders a status may count in `formed` or `holding`.
pub const MAX_LISTED: usize = MAX_EXPECTED as usize;

/// How far a status's time stamp may lie from the receiver's clock (10 minutes): statuses are
/// bound to time so that an old one cannot be replayed as current.
pub const MAX_STATUS_SKEW_MS: u64 = 10 * 60 * 1000;

/// Largest encoded status.
pub const MAX_STATUS_BYTES: usize = 512;

/// Largest encoded [`StatusLists`]: both lists full.
pub const MAX_STATUS_LISTS_BYTES: usize = MAX_LISTED * (66 + 33) + 64;

/// Why a status was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatusError {
    #[error("{0}")]
    Verify(#[from] crate::VerifyError),
    #[error("status does not decode: {0}")]
    Decode(#[from] crate::DecodeError),
    #[error("status counts {0} senders (limit {MAX_LISTED})")]
    TooLong(usize),
    #[error("the lists sent with a status are not the ones it commits to")]
    ListsMismatch,
    #[error(
        "status body says round {body_round} / state {body_hash}, its signed header round {header_round} / state {header_hash}"
    )]
    Mismatch {
        body_round: u64,
        body_hash: String,
        header_round: u64,
        header_hash: String,
    },
    #[error("status is {0} s away from this node's clock (limit {limit} s)", limit = MAX_STATUS_SKEW_MS / 1000)]
    Stale(u64),
}

/// Signs `status` as `key`'s status in swarm `swarm_id`. The header binds the round and the
/// state hash, so the envelope attests that its signer holds that state.
pub fn sign_status(
    key: &ed25519_dalek::SigningKey,
    swarm_id: Hash32,
    status: &Status,
) -> SignedEnvelope {
    let header = crate::signed::EnvelopeHeader {
        kind: crate::PayloadKind::Status,
        swarm_id,
        round: status.round,
        sender: [0; 32],
        base_hash: status.state_hash,
    };
    SignedEnvelope::sign(key, header, crate::wire::encode(status))
}

/// Verifies a status envelope for swarm `swarm_id` (its sender on `allowlist` when that is
/// given), decodes it, and checks it against the receiver's clock `now_ms`.
///
/// # Errors
/// A bad signature, another swarm or kind, a sender not allowed, an undecodable or oversized
/// status, a body that differs from the signed header, or a time stamp too far from `now_ms`.
pub fn open_status(
    env: &SignedEnvelope,
    swarm_id: &Hash32,
    allowlist: Option<&[[u8; 32]]>,
    now_ms: u64,
) -> Result<Status, StatusError> {
    let expect = crate::Expectation {
        kind: crate::PayloadKind::Status,
        swarm_id: *swarm_id,
        round: env.header.round,
        base_hash: env.header.base_hash,
        allowlist,
        max_payload: MAX_STATUS_BYTES,
    };
    let body = env.verify(&expect)?;
    let s: Status = crate::wire::decode(body, MAX_STATUS_BYTES)?;
    let listed = s.formed.max(s.holding) as usize;
    if listed > MAX_LISTED {
        return Err(StatusError::TooLong(listed));
    }
    if s.round != env.header.round || s.state_hash != env.header.base_hash {
        return Err(StatusError::Mismatch {
            body_round: s.round,
            body_hash: s.state_hash.short(),
            header_round: env.header.round,
            header_hash: env.header.base_hash.short(),
        });
    }
    let skew = now_ms.abs_diff(s.unix_ms);
    if skew > MAX_STATUS_SKEW_MS {
        return Err(StatusError::Stale(skew / 1000));
    }
    Ok(s)
}

/// Verifies a status with the lists it commits to ([`crate::Response::StatusLists`]): the status as
/// [`open_status`] does, then the lists against its counts and roots.
///
/// # Errors
/// As [`open_status`], or lists that are not the ones the status commits to.
pub fn open_status_lists(
    env: &SignedEnvelope,
    lists: &StatusLists,
    swarm_id: &Hash32,
    allowlist: Option<&[[u8; 32]]>,
    now_ms: u64,
) -> Result<Status, StatusError> {
    let s = open_status(env, swarm_id, allowlist, now_ms)?;
    if !lists.matches(&s) {
        return Err(StatusError::ListsMismatch);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{WindowRecord, WindowState, sign_window};
    use crate::wire;

    fn lists() -> StatusLists {
        StatusLists {
            formed_by: vec![
                ContributionId {
                    sender: [1; 32],
                    digest: Hash32::of(&[b"a"]),
                },
                ContributionId {
                    sender: [2; 32],
                    digest: Hash32::of(&[b"b"]),
                },
            ],
            holding: vec![[3; 32]],
        }
    }

    fn status(round: u64) -> Status {
        let mut s = Status::summarizing(
            NodeRole::Trainer,
            Phase::Ready,
            round,
            Hash32::of(&[b"theta"]),
            &lists(),
        );
        s.unix_ms = 1_700_000_000_000;
        s
    }

    #[test]
    fn signed_statuses_verify_and_refuse_outsiders_tampering_and_stale_ones() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let me = key.verifying_key().to_bytes();
        let swarm = Hash32::of(&[b"swarm"]);
        let now = 1_700_000_000_000;
        let env = sign_status(&key, swarm, &status(4));
        assert_eq!(open_status(&env, &swarm, None, now).unwrap(), status(4));
        assert_eq!(
            open_status(&env, &swarm, Some(&[me]), now + 1000).unwrap(),
            status(4)
        );
        // Not on the allowlist, another swarm, tampered, relabelled.
        assert!(matches!(
            open_status(&env, &swarm, Some(&[[9; 32]]), now),
            Err(StatusError::Verify(crate::VerifyError::NotAMember(_)))
        ));
        assert!(open_status(&env, &Hash32::of(&[b"other"]), None, now).is_err());
        let mut t = env.clone();
        t.header.round = 9;
        assert!(matches!(
            open_status(&t, &swarm, None, now),
            Err(StatusError::Verify(crate::VerifyError::BadSignature))
        ));
        // An unsigned one.
        let mut t = env.clone();
        t.signature.clear();
        assert!(open_status(&t, &swarm, None, now).is_err());
        // A body that says another round than its signed header: refused.
        let header = crate::signed::EnvelopeHeader {
            kind: crate::PayloadKind::Status,
            swarm_id: swarm,
            round: 7,
            sender: [0; 32],
            base_hash: Hash32::of(&[b"theta"]),
        };
        let lie = SignedEnvelope::sign(&key, header, wire::encode(&status(4)));
        assert!(matches!(
            open_status(&lie, &swarm, None, now),
            Err(StatusError::Mismatch { .. })
        ));
        // Too old, or from the future.
        assert!(matches!(
            open_status(&env, &swarm, None, now + MAX_STATUS_SKEW_MS + 1),
            Err(StatusError::Stale(_))
        ));
        assert!(matches!(
            open_status(&env, &swarm, None, now - MAX_STATUS_SKEW_MS - 1),
            Err(StatusError::Stale(_))
        ));
        // A window envelope is not a status.
        let rec = WindowRecord {
            device_kind: "cpu".into(),
            device_name: String::new(),
            memory_bytes: 0,
            tokens_per_sec: 1.0,
            open_until: None,
            state: WindowState::Training,
            reason: String::new(),
            round: 1,
            updated_at: 1,
        };
        let w = sign_window(&key, swarm, Hash32::default(), &rec);
        assert!(open_status(&w, &swarm, None, now).is_err());
        // A status counting more senders than any swarm can hold.
        let mut long = status(4);
        long.holding = MAX_LISTED as u32 + 1;
        let env = sign_status(&key, swarm, &long);
        assert!(open_status(&env, &swarm, None, now).is_err());
    }

    #[test]
    fn a_status_stays_small_and_its_lists_check_against_it() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let swarm = Hash32::of(&[b"swarm"]);
        let now = 1_700_000_000_000;
        // A status of a round formed by a thousand contributions is as small as one of round 0.
        let many = StatusLists {
            formed_by: (0..1000u32)
                .map(|i| ContributionId {
                    sender: Hash32::of(&[&i.to_le_bytes()]).0,
                    digest: Hash32::of(&[b"d", &i.to_le_bytes()]),
                })
                .collect(),
            holding: (0..1000u32)
                .map(|i| Hash32::of(&[b"k", &i.to_le_bytes()]).0)
                .collect(),
        };
        let big = Status::summarizing(NodeRole::Trainer, Phase::Ready, 4, Hash32::default(), &many);
        let small = Status::summarizing(
            NodeRole::Trainer,
            Phase::Ready,
            4,
            Hash32::default(),
            &StatusLists::default(),
        );
        let size = |s: &Status| wire::encode(&sign_status(&key, swarm, s)).len();
        assert!(
            size(&big) <= size(&small) + 8,
            "{} vs {}",
            size(&big),
            size(&small)
        );
        assert!(wire::encode(&big).len() <= MAX_STATUS_BYTES);
        assert!(wire::encode(&many).len() <= MAX_STATUS_LISTS_BYTES);
        // The lists check against the status in any order; any other lists do not.
        let env = sign_status(&key, swarm, &status(4));
        assert_eq!(
            open_status_lists(&env, &lists(), &swarm, None, now).unwrap(),
            status(4)
        );
        let mut reordered = lists();
        reordered.formed_by.reverse();
        assert!(open_status_lists(&env, &reordered, &swarm, None, now).is_ok());
        let mut other = lists();
        other.formed_by[0].digest = Hash32::of(&[b"another"]);
        assert_eq!(
            open_status_lists(&env, &other, &swarm, None, now),
            Err(StatusError::ListsMismatch)
        );
        let mut fewer = lists();
        fewer.holding.clear();
        assert!(!fewer.matches(&status(4)));
        // A sender named twice in formed_by matches nothing, even a status built from it.
        let mut twice = lists();
        twice.formed_by[1].sender = twice.formed_by[0].sender;
        let s = Status::summarizing(
            NodeRole::Trainer,
            Phase::Ready,
            4,
            Hash32::default(),
            &twice,
        );
        assert!(!twice.matches(&s));
    }
}
