//! What a node trains on: each round a few shards of the swarm's dataset, drawn from the node's
//! key and the round, read from disk and tokenized when the round starts (the last round's text
//! is kept while the same shards are drawn again).

use nightshift_model::dataset::{DOCUMENT_SEPARATOR, Dataset, shard_for};
use nightshift_model::{Corpus, Shard, Tokenizer};

/// The shards this node draws from, and the one loaded.
pub(super) struct Feed {
    dataset: Dataset,
    tok: Tokenizer,
    seq_len: usize,
    /// The node's public key: with the round, it picks the shard.
    key: [u8; 32],
    /// The shards this node may train on (all, or every COUNT-th from INDEX with `--shard`).
    allowed: Vec<usize>,
    /// Shards read per round.
    per_round: u32,
    loaded: Option<(Vec<usize>, Corpus)>,
}

impl Feed {
    /// # Errors
    /// When `--shard INDEX/COUNT` leaves this node no shard.
    pub(super) fn new(
        dataset: Dataset,
        tok: Tokenizer,
        seq_len: usize,
        key: [u8; 32],
        only: Option<(usize, usize)>,
        per_round: u32,
    ) -> anyhow::Result<Self> {
        let n = dataset.shard_count();
        let allowed: Vec<usize> = match only {
            Some((i, count)) => (0..n).filter(|s| s % count == i).collect(),
            None => (0..n).collect(),
        };
        if allowed.is_empty() {
            anyhow::bail!(
                "--shard {}/{} leaves this node none of the dataset's {n} shards",
                only.map_or(0, |o| o.0),
                only.map_or(0, |o| o.1)
            );
        }
        Ok(Feed {
            dataset,
            tok,
            seq_len,
            key,
            allowed,
            per_round: per_round.max(1),
            loaded: None,
        })
    }

    /// The dataset's shards (for logs).
    pub(super) fn shard_count(&self) -> usize {
        self.dataset.shard_count()
    }

    /// How many shards this node draws from.
    pub(super) fn allowed_count(&self) -> usize {
        self.allowed.len()
    }

    /// The training tokens for `round`: the text of its shards, joined (loaded unless they are
    /// the ones held).
    ///
    /// # Errors
    /// A file that cannot be read any more, text the tokenizer refuses, or shards that hold
    /// less than one window.
    pub(super) fn for_round(&mut self, round: u64) -> Result<(&Corpus, Shard), String> {
        let n = self.allowed.len();
        let drawn: Vec<usize> = (0..self.per_round)
            .map(|j| self.allowed[shard_for(&self.key, round, j, n)])
            .collect();
        if self.loaded.as_ref().is_none_or(|(held, _)| *held != drawn) {
            let mut text = Vec::new();
            for &index in &drawn {
                if !text.is_empty() {
                    text.extend_from_slice(DOCUMENT_SEPARATOR);
                }
                text.extend(
                    self.dataset
                        .shard_text(index)
                        .map_err(|e| format!("cannot read shard {index} of the dataset: {e}"))?,
                );
            }
            let tokens = self
                .tok
                .encode(&text)
                .map_err(|e| format!("the dataset's shards {drawn:?}: {e}"))?;
            self.loaded = Some((drawn, Corpus::from_parts(tokens, vec![])));
        }
        match &self.loaded {
            Some((_, c)) if c.train_len() > self.seq_len + 1 => Ok((c, c.full_shard())),
            _ => Err("this round's shards hold less than one window".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_model::dataset::{DataFile, Format, Source};
    use std::sync::Arc;

    fn feed(only: Option<(usize, usize)>, per_round: u32) -> anyhow::Result<Feed> {
        let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let tok = Tokenizer::from_corpus(text.as_bytes());
        let file = DataFile {
            bytes: text.len() as u64,
            source: Source::Memory(Arc::from(text.into_bytes())),
            format: Format::Text,
        };
        // About 17 KB of training text in shards of 4 KiB.
        let dataset = Dataset::new(vec![file], 100, 4096)?;
        Feed::new(dataset, tok, 16, [7; 32], only, per_round)
    }

    #[test]
    fn a_round_joins_its_shards_and_a_restricted_node_draws_only_its_own() {
        let mut f = feed(None, 4).unwrap();
        assert_eq!(f.shard_count(), 5);
        let a = f.for_round(3).unwrap().0.train_tokens().to_vec();
        // Four shards of about 3.5 KB each, joined.
        assert!(a.len() > 3 * 3400 && a.len() < 4 * 4200, "{}", a.len());
        assert_eq!(a, f.for_round(3).unwrap().0.train_tokens());
        let others = (4..10)
            .filter(|r| f.for_round(*r).unwrap().0.train_tokens() != a.as_slice())
            .count();
        assert!(others >= 5, "rounds draw anew");

        let mut odd = feed(Some((1, 2)), 1).unwrap();
        assert_eq!(odd.allowed_count(), 2);
        for r in 0..20 {
            odd.for_round(r).unwrap();
            assert!(odd.loaded.as_ref().unwrap().0.iter().all(|s| s % 2 == 1));
        }
        let err = feed(Some((7, 8)), 1).err().unwrap().to_string();
        assert!(err.contains("--shard 7/8"), "{err}");
    }
}
