//! A tokenized corpus in memory: train/validation split, shards of the training part and
//! batches. The byte tokenizer maps the corpus's bytes onto a dense vocabulary (the distinct
//! bytes, sorted), so any UTF-8 file works and the Shakespeare corpus needs 84 symbols.

use rand::Rng;

pub use crate::tokenizer::Tokenizer;
use std::ops::Range;
use thiserror::Error;

/// The embedded default corpus: Shakespeare's plays and poems (public domain, Project Gutenberg).
pub static EMBEDDED_CORPUS: &[u8] = include_bytes!("../data/shakespeare.txt");
/// The name the embedded corpus goes by in manifests.
pub const EMBEDDED_NAME: &str = "embedded:shakespeare";

/// Why a corpus could not be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DataError {
    #[error("the corpus is not UTF-8 text (invalid byte at offset {0})")]
    NotUtf8(usize),
    #[error(
        "the corpus holds byte {byte:#04x} at offset {offset}, which is not in the swarm's vocabulary"
    )]
    OutOfVocabulary { byte: u8, offset: usize },
    #[error("the corpus is too small: {tokens} tokens, need at least {needed}")]
    TooSmall { tokens: usize, needed: usize },
    #[error("the vocabulary is empty or holds a byte twice")]
    BadVocabulary,
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// A tokenized corpus split into a training part and a held-out validation tail.
#[derive(Clone, Debug)]
pub struct Corpus {
    tokens: Vec<u32>,
    split: usize,
}

/// A contiguous range of the training tokens given to one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub range: Range<usize>,
}

impl Corpus {
    /// Tokenizes `text` and holds out the last `val_permille`/1000 for validation.
    ///
    /// # Errors
    /// When the text is not UTF-8, has bytes outside the vocabulary, or is too small for
    /// windows of `seq_len + 1` tokens in both parts.
    pub fn new(
        text: &[u8],
        tok: &Tokenizer,
        val_permille: u32,
        seq_len: usize,
    ) -> Result<Self, DataError> {
        if let Err(e) = std::str::from_utf8(text) {
            return Err(DataError::NotUtf8(e.valid_up_to()));
        }
        let tokens = tok.encode(text)?;
        let val = tokens.len() * val_permille.min(999) as usize / 1000;
        let split = tokens.len() - val;
        let needed = 2 * (seq_len + 1);
        if val < seq_len + 1 || split < seq_len + 1 {
            return Err(DataError::TooSmall {
                tokens: tokens.len(),
                needed,
            });
        }
        Ok(Corpus { tokens, split })
    }

    /// A corpus of already tokenized training and validation parts (either may be empty; the
    /// methods that read a part need it to hold more than one window).
    pub fn from_parts(mut train: Vec<u32>, val: Vec<u32>) -> Self {
        let split = train.len();
        train.extend(val);
        Corpus {
            tokens: train,
            split,
        }
    }

    /// The training tokens.
    pub fn train_tokens(&self) -> &[u32] {
        &self.tokens[..self.split]
    }

    /// The validation tokens.
    pub fn val_tokens(&self) -> &[u32] {
        &self.tokens[self.split..]
    }

    /// Number of training tokens.
    pub fn train_len(&self) -> usize {
        self.split
    }

    /// Number of validation tokens.
    pub fn val_len(&self) -> usize {
        self.tokens.len() - self.split
    }

    /// The `index`-th of `count` equal contiguous shards of the training tokens.
    pub fn shard(&self, index: usize, count: usize) -> Shard {
        let count = count.max(1);
        let index = index % count;
        let size = self.split / count;
        let end = if index + 1 == count {
            self.split
        } else {
            (index + 1) * size
        };
        Shard {
            range: index * size..end,
        }
    }

    /// The whole training part as one shard.
    pub fn full_shard(&self) -> Shard {
        Shard {
            range: 0..self.split,
        }
    }

    /// A random batch of `batch` windows of `seq` tokens from `shard`: (inputs, targets), row-major.
    pub fn sample_batch(
        &self,
        shard: &Shard,
        rng: &mut impl Rng,
        batch: usize,
        seq: usize,
    ) -> (Vec<i32>, Vec<i32>) {
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        let span = shard.range.len().saturating_sub(seq + 1).max(1);
        for _ in 0..batch {
            let start = (shard.range.start + rng.random_range(0..span)).min(self.split - seq - 1);
            let w = &self.tokens[start..start + seq + 1];
            inputs.extend(w[..seq].iter().map(|t| *t as i32));
            targets.extend(w[1..].iter().map(|t| *t as i32));
        }
        (inputs, targets)
    }

    /// Up to `max_batches` fixed, non-overlapping validation batches (the same on every node).
    pub fn val_batches(
        &self,
        batch: usize,
        seq: usize,
        max_batches: usize,
    ) -> Vec<(Vec<i32>, Vec<i32>)> {
        let val = &self.tokens[self.split..];
        let windows = (val.len() - 1) / seq;
        let n_batches = (windows / batch.max(1)).clamp(1, max_batches.max(1));
        let stride = ((val.len() - seq - 1) / (n_batches * batch).max(1)).max(1);
        (0..n_batches)
            .map(|b| {
                let mut inputs = Vec::with_capacity(batch * seq);
                let mut targets = Vec::with_capacity(batch * seq);
                for r in 0..batch {
                    let start = ((b * batch + r) * stride).min(val.len() - seq - 1);
                    inputs.extend(val[start..start + seq].iter().map(|t| *t as i32));
                    targets.extend(val[start + 1..start + seq + 1].iter().map(|t| *t as i32));
                }
                (inputs, targets)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn embedded_corpus_has_the_expected_vocabulary() {
        let tok = Tokenizer::from_corpus(EMBEDDED_CORPUS);
        assert_eq!(tok.len(), 84);
        let c = Corpus::new(EMBEDDED_CORPUS, &tok, 100, 64).unwrap();
        assert_eq!(c.train_len() + c.val_len(), EMBEDDED_CORPUS.len());
        assert_eq!(tok.decode(&tok.encode(b"To be").unwrap()), "To be");
    }

    #[test]
    fn shards_cover_the_training_part_without_overlap() {
        let text = "abcdefghij".repeat(100);
        let tok = Tokenizer::from_corpus(text.as_bytes());
        let c = Corpus::new(text.as_bytes(), &tok, 100, 8).unwrap();
        let shards: Vec<_> = (0..3).map(|i| c.shard(i, 3)).collect();
        assert_eq!(shards[0].range.start, 0);
        assert_eq!(shards[2].range.end, c.train_len());
        assert_eq!(shards[0].range.end, shards[1].range.start);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let (x, y) = c.sample_batch(&shards[1], &mut rng, 4, 8);
        assert_eq!((x.len(), y.len()), (32, 32));
        // Targets are inputs shifted by one.
        assert_eq!(&x[1..8], &y[..7]);
    }

    #[test]
    fn refuses_non_utf8_out_of_vocabulary_and_tiny_corpora() {
        let tok = Tokenizer::from_vocab(b"ab".to_vec()).unwrap();
        assert_eq!(
            Corpus::new(&[0xff, 0xfe], &tok, 100, 4).unwrap_err(),
            DataError::NotUtf8(0)
        );
        assert!(matches!(
            Corpus::new(b"abc", &tok, 100, 4),
            Err(DataError::OutOfVocabulary {
                byte: b'c',
                offset: 2
            })
        ));
        assert!(matches!(
            Corpus::new(b"abab", &tok, 100, 4),
            Err(DataError::TooSmall { .. })
        ));
        assert_eq!(
            Tokenizer::from_vocab(b"aa".to_vec()).unwrap_err(),
            DataError::BadVocabulary
        );
    }
}
