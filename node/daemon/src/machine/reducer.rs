//! The three parts of a reduce-scatter round, each checking what it receives before it counts
//! it: a contributor cuts and signs its delta (`nightshift_protocol::slices::SlicedDelta`); the
//! reducer of a slice gathers that slice of every contribution ([`Reducer::offer`], checked
//! against each sender's signed root) and averages it ([`Reducer::reduce`]); the slice's second
//! reducer recomputes the same average from its own copies and co-signs it only if the bytes
//! match ([`Reducer::check`]); every node gathers the reduced slices, each signed by both its
//! reducers ([`Combiner::offer`]), and takes the round's step from them ([`Combiner::step`]):
//! the step [`super::sliced::sliced_round_step`] takes from the same contributions, bit for bit.
//!
//! The machine runs them in a round that averages slice by slice (`combine.rs`).

use super::Key;
use super::accept::RoundStep;
use super::rules::{Recipe, sliced_open_bound};
use super::sliced::{Slicing, combine, reduce_slice};
use ed25519_dalek::SigningKey;
use nightshift_model::outer::{NoiseSums, WeightedDelta};
use nightshift_protocol::slices::{
    CheckedInputs, OpenedSlice, ReducedInput, ReducedSlice, Slice, SliceContext, SliceError,
    inputs_digest, open_reduced_checked, open_slice_unless_verified, sign_reduced,
};
use nightshift_protocol::{ContributionId, Hash32, SignedEnvelope, wire};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a round's slices must match, owned (the recipe's rules and the round's base).
#[derive(Clone, Debug)]
pub struct RoundSlices {
    pub recipe: Arc<Recipe>,
    pub round: u64,
    pub base_hash: Hash32,
    pub slicing: Slicing,
}

impl RoundSlices {
    /// The protocol's view of these rules.
    pub fn context(&self) -> SliceContext<'_> {
        let r = &self.recipe;
        SliceContext {
            swarm_id: r.swarm_id,
            round: self.round,
            base_hash: self.base_hash,
            allowlist: r.allowlist.as_deref(),
            num_params: r.num_params,
            codec: r.codec,
            slices: self.slicing.slices,
            mean_codec: self.slicing.mean_codec,
            max_tokens: r.max_tokens,
        }
    }
}

/// The reducer of one slice of a round: the slices it gathered, one per sender.
#[derive(Debug)]
pub struct Reducer {
    rules: RoundSlices,
    index: u32,
    inputs: BTreeMap<Key, OpenedSlice>,
}

/// Why a reducer did not take a slice.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refused {
    #[error("{0}")]
    Slice(#[from] SliceError),
    #[error("slice {got} sent to the reducer of slice {want}")]
    OtherSlice { got: u32, want: u32 },
    #[error("a second contribution from the same sender this round")]
    Equivocation,
    #[error("more contributions than a round counts ({0})")]
    Full(usize),
}

impl Reducer {
    pub fn new(rules: RoundSlices, index: u32) -> Self {
        Reducer {
            rules,
            index,
            inputs: BTreeMap::new(),
        }
    }

    /// Checks `slice` and keeps it. `Ok(false)`: this very contribution was held already.
    ///
    /// # Errors
    /// A slice that does not check out, of another slice, a second contribution by one sender
    /// (both are kept out of nothing: the first stays), or one past the round's bound.
    pub fn offer(&mut self, slice: &Slice) -> Result<bool, Refused> {
        self.offer_verified(slice, None)
    }

    /// [`Self::offer`], with the header the caller already verified for this contribution: a
    /// slice that carries it byte for byte has its signature checked no second time.
    ///
    /// # Errors
    /// As [`Self::offer`].
    pub fn offer_verified(
        &mut self,
        slice: &Slice,
        verified: Option<&SignedEnvelope>,
    ) -> Result<bool, Refused> {
        if slice.index != self.index {
            return Err(Refused::OtherSlice {
                got: slice.index,
                want: self.index,
            });
        }
        let id = ContributionId::of(&slice.envelope);
        if let Some(held) = self.inputs.get(&id.sender) {
            return if held.id == id {
                Ok(false)
            } else {
                Err(Refused::Equivocation)
            };
        }
        let max = match self.rules.recipe.allowlist {
            Some(_) => self.rules.recipe.max_contributors(),
            None => sliced_open_bound(self.rules.slicing.slices),
        };
        if self.inputs.len() >= max {
            return Err(Refused::Full(max));
        }
        let opened = open_slice_unless_verified(slice, &self.rules.context(), verified)?;
        self.inputs.insert(id.sender, opened);
        Ok(true)
    }

    /// The contributions held.
    pub fn held(&self) -> impl Iterator<Item = ContributionId> + '_ {
        self.inputs.values().map(|o| o.id)
    }

    /// Whether every one of `ids` is held (the very contribution each names).
    pub fn holds(&self, ids: &[ContributionId]) -> bool {
        ids.iter()
            .all(|id| self.inputs.get(&id.sender).is_some_and(|o| o.id == *id))
    }

    /// The reduced slice of exactly `ids` (all held when `None`), and the inputs it names, in
    /// key order. `None` when nothing is held or one of `ids` is not.
    pub fn reduce(
        &self,
        ids: Option<&[ContributionId]>,
    ) -> Option<(ReducedSlice, Vec<ReducedInput>)> {
        let chosen: Vec<&OpenedSlice> = match ids {
            None => self.inputs.values().collect(),
            Some(ids) => ids
                .iter()
                .map(|id| self.inputs.get(&id.sender).filter(|o| o.id == *id))
                .collect::<Option<_>>()?,
        };
        let parts: Vec<WeightedDelta<'_>> = chosen
            .iter()
            .map(|o| WeightedDelta {
                delta: &o.values,
                weight: o.header.tokens as f64,
            })
            .collect();
        let (mean, _, sums) = reduce_slice(
            &parts,
            self.rules.recipe.aggregator,
            self.rules.slicing.mean_codec,
        )?;
        let sums = sums.unwrap_or(NoiseSums {
            n: chosen.len(),
            mean_sq: 0.0,
            spread: 0.0,
        });
        let inputs: Vec<ReducedInput> = chosen
            .iter()
            .map(|o| ReducedInput {
                id: o.id,
                tokens: o.header.tokens,
                expected: o.header.expected,
            })
            .collect();
        let reduced = ReducedSlice {
            index: self.index,
            slices: self.rules.slicing.slices,
            inputs: inputs_digest(&inputs),
            count: inputs.len() as u32,
            mean,
            mean_sq: sums.mean_sq,
            spread: sums.spread,
        };
        Some((reduced, inputs))
    }

    /// Signs `payload` as this node's reduced slice.
    pub fn sign(&self, key: &SigningKey, payload: &ReducedSlice) -> SignedEnvelope {
        let r = &self.rules;
        sign_reduced(key, r.recipe.swarm_id, r.round, r.base_hash, payload)
    }

    /// As the slice's second reducer: recompute `theirs` (counting `inputs`) from our own copies
    /// of its inputs and co-sign it when the bytes match.
    ///
    /// # Errors
    /// What we lack to check it, or that our result differs.
    pub fn check(
        &self,
        key: &SigningKey,
        theirs: &ReducedSlice,
        inputs: &[ReducedInput],
    ) -> Result<SignedEnvelope, String> {
        let ids: Vec<ContributionId> = inputs.iter().map(|i| i.id).collect();
        let (mine, _) = self
            .reduce(Some(&ids))
            .ok_or("we do not hold every contribution it counts")?;
        if wire::encode(&mine) != wire::encode(theirs) {
            return Err(format!(
                "our average of slice {} over the same {} contributions differs",
                self.index,
                ids.len()
            ));
        }
        Ok(self.sign(key, &mine))
    }
}

/// A node gathering a round's reduced slices.
#[derive(Debug)]
pub struct Combiner {
    rules: RoundSlices,
    slices: Vec<Option<(ReducedSlice, Vec<f32>)>>,
    /// The input lists the slices name, by digest.
    inputs: BTreeMap<Hash32, Vec<ReducedInput>>,
}

impl Combiner {
    pub fn new(rules: RoundSlices) -> Self {
        let n = rules.slicing.slices as usize;
        Combiner {
            rules,
            slices: vec![None; n],
            inputs: BTreeMap::new(),
        }
    }

    /// Checks a reduced slice signed by `signed` against the keys the round assigned to it
    /// (`reducers`, every one of which must have signed) and the inputs it counts, and keeps
    /// it. Returns its index.
    ///
    /// # Errors
    /// See [`open_reduced_checked`].
    pub fn offer(
        &mut self,
        signed: &[SignedEnvelope],
        reducers: &[Key],
        inputs: &CheckedInputs,
    ) -> Result<u32, SliceError> {
        let (r, values) = open_reduced_checked(signed, reducers, inputs, &self.rules.context())?;
        let i = r.index;
        self.inputs
            .entry(r.inputs)
            .or_insert_with(|| inputs.list().to_vec());
        self.slices[i as usize] = Some((r, values));
        Ok(i)
    }

    /// Keeps a reduced slice this node computed itself from the slices it gathered (no
    /// signature needed: it trusts its own arithmetic). Returns its index.
    ///
    /// # Errors
    /// When its mean does not decode to the slice's length.
    pub fn insert_own(
        &mut self,
        reduced: ReducedSlice,
        inputs: &[ReducedInput],
    ) -> Result<u32, SliceError> {
        let ranges = self.rules.context().ranges()?;
        let i = reduced.index;
        let len = ranges
            .get(i as usize)
            .ok_or(SliceError::NoSuchSlice {
                index: i,
                slices: self.rules.slicing.slices,
            })?
            .len();
        let values = nightshift_protocol::delta::decode(&reduced.mean, len)?;
        self.inputs
            .entry(reduced.inputs)
            .or_insert_with(|| inputs.to_vec());
        self.slices[i as usize] = Some((reduced, values));
        Ok(i)
    }

    /// Whether reduced slice `index` is in.
    pub fn has(&self, index: u32) -> bool {
        self.slices.get(index as usize).is_some_and(Option::is_some)
    }

    /// Whether the input list `digest` is held already (a node fetches each list once).
    pub fn has_inputs(&self, digest: &Hash32) -> bool {
        self.inputs.contains_key(digest)
    }

    /// The slices still missing.
    pub fn missing(&self) -> Vec<u32> {
        (0..self.slices.len() as u32)
            .filter(|i| self.slices[*i as usize].is_none())
            .collect()
    }

    /// The round's step from state noise `noise`, and the contributions that formed it (every
    /// one counted by some slice), once every slice is in.
    pub fn step(&self, noise: Option<f64>) -> Option<(RoundStep, Vec<ContributionId>)> {
        let all: Vec<&(ReducedSlice, Vec<f32>)> = self.slices.iter().flatten().collect();
        if all.len() != self.slices.len() {
            return None;
        }
        let mut formed: BTreeMap<ContributionId, u32> = BTreeMap::new();
        for (r, _) in &all {
            for i in self.inputs.get(&r.inputs)? {
                formed.insert(i.id, i.expected);
            }
        }
        let reduced = all
            .iter()
            .map(|(r, v)| {
                let sums = NoiseSums {
                    n: r.count as usize,
                    mean_sq: r.mean_sq,
                    spread: r.spread,
                };
                (v.clone(), Some(sums))
            })
            .collect();
        let expected: Vec<u32> = formed.values().copied().collect();
        let step = combine(reduced, &expected, noise)?;
        Some((step, formed.into_keys().collect()))
    }
}

#[cfg(test)]
pub(super) mod tests;
