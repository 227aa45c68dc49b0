//! What a node trains on: each round one shard of the swarm's dataset, chosen from the node's
//! key and the round, read from disk and tokenized when the round starts (the last one is kept
//! while it is chosen again).

use nightshift_model::dataset::{Dataset, shard_for};
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
    loaded: Option<(usize, Corpus)>,
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
    ) -> anyhow::Result<Self> {
        let n = dataset.shards().len();
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
            loaded: None,
        })
    }

    /// The dataset's shards (for logs).
    pub(super) fn shard_count(&self) -> usize {
        self.dataset.shards().len()
    }

    /// How many shards this node draws from.
    pub(super) fn allowed_count(&self) -> usize {
        self.allowed.len()
    }

    /// The training tokens for `round`: its shard, loaded unless it is the one held. A shard too
    /// short for one window gives way to the next allowed one.
    ///
    /// # Errors
    /// A file that cannot be read any more, or text the tokenizer refuses.
    pub(super) fn for_round(&mut self, round: u64) -> Result<(&Corpus, Shard), String> {
        let first = shard_for(&self.key, round, self.allowed.len());
        let mut usable = false;
        for k in 0..self.allowed.len() {
            let index = self.allowed[(first + k) % self.allowed.len()];
            if self.loaded.as_ref().is_none_or(|(i, _)| *i != index) {
                let text = self
                    .dataset
                    .shard_text(index)
                    .map_err(|e| format!("cannot read shard {index} of the dataset: {e}"))?;
                let tokens = self
                    .tok
                    .encode(&text)
                    .map_err(|e| format!("shard {index} of the dataset: {e}"))?;
                self.loaded = Some((index, Corpus::from_parts(tokens, vec![])));
            }
            if self
                .loaded
                .as_ref()
                .is_some_and(|(_, c)| c.train_len() > self.seq_len + 1)
            {
                usable = true;
                break;
            }
        }
        if let (true, Some((_, c))) = (usable, &self.loaded) {
            return Ok((c, c.full_shard()));
        }
        Err("no shard of the dataset holds a whole window".into())
    }
}
