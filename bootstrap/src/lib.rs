//! What a swarm creator runs: swarm creation ([`swarm`]: keys, the signed manifest, the swarm's
//! pre-shared key) and the bootstrap node ([`node`]: the node others dial first, which follows
//! every round by replay and attests the swarm's state). Genesis — keys, the manifest, θ(0) — is
//! below it, in `nightshift-genesis`, re-exported here.

pub mod node;
pub mod swarm;

pub use nightshift_genesis::*;
