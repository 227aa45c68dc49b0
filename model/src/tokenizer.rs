//! Tokenizers: the byte tokenizer (the distinct bytes of a corpus, a vocabulary of at most
//! 256) and Hugging Face `tokenizer.json` files (BPE and the rest, through the `tokenizers`
//! crate).

use std::sync::Arc;

use crate::DataError;

/// The byte tokenizer: each byte of the text is one token, over a dense vocabulary of the bytes
/// that occur.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByteTokenizer {
    vocab: Vec<u8>,
    index: [Option<u8>; 256],
}

impl ByteTokenizer {
    fn new(vocab: Vec<u8>) -> Result<Self, DataError> {
        let mut index = [None; 256];
        if vocab.is_empty() || vocab.len() > 256 {
            return Err(DataError::BadVocabulary);
        }
        for (i, b) in vocab.iter().enumerate() {
            if index[*b as usize].replace(i as u8).is_some() {
                return Err(DataError::BadVocabulary);
            }
        }
        Ok(ByteTokenizer { vocab, index })
    }
}

/// Maps text to token ids and back.
#[derive(Clone)]
pub enum Tokenizer {
    Bytes(Box<ByteTokenizer>),
    /// A Hugging Face tokenizer with its vocabulary size (added tokens included).
    HuggingFace(Arc<tokenizers::Tokenizer>, usize),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Bytes(b) => write!(f, "Tokenizer::Bytes({} symbols)", b.vocab.len()),
            Tokenizer::HuggingFace(_, n) => write!(f, "Tokenizer::HuggingFace({n} tokens)"),
        }
    }
}

/// Largest `tokenizer.json` read.
pub const MAX_TOKENIZER_BYTES: usize = 64 << 20;

impl Tokenizer {
    /// The byte tokenizer over the distinct bytes of `text`, sorted.
    pub fn from_corpus(text: &[u8]) -> Self {
        let mut seen = [false; 256];
        text.iter().for_each(|b| seen[*b as usize] = true);
        let mut vocab: Vec<u8> = (0..=255u8).filter(|b| seen[*b as usize]).collect();
        if vocab.is_empty() {
            vocab.push(b'\n');
        }
        Tokenizer::Bytes(Box::new(ByteTokenizer::new(vocab).expect("distinct bytes")))
    }

    /// The byte tokenizer over the given symbols, in token order.
    ///
    /// # Errors
    /// When the vocabulary is empty or repeats a byte.
    pub fn from_vocab(vocab: Vec<u8>) -> Result<Self, DataError> {
        Ok(Tokenizer::Bytes(Box::new(ByteTokenizer::new(vocab)?)))
    }

    /// A Hugging Face tokenizer from the contents of a `tokenizer.json`.
    ///
    /// # Errors
    /// When the file is too large or not a tokenizer the `tokenizers` crate reads.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DataError> {
        if bytes.len() > MAX_TOKENIZER_BYTES {
            return Err(DataError::Tokenizer(format!(
                "the tokenizer.json is {} bytes; at most {MAX_TOKENIZER_BYTES} are read",
                bytes.len()
            )));
        }
        let t = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| DataError::Tokenizer(e.to_string()))?;
        let n = t.get_vocab_size(true);
        if n < 2 {
            return Err(DataError::Tokenizer(format!(
                "the tokenizer has {n} tokens"
            )));
        }
        Ok(Tokenizer::HuggingFace(Arc::new(t), n))
    }

    /// The byte tokenizer's symbols in token order; `None` for a Hugging Face tokenizer.
    pub fn byte_vocab(&self) -> Option<&[u8]> {
        match self {
            Tokenizer::Bytes(b) => Some(&b.vocab),
            Tokenizer::HuggingFace(..) => None,
        }
    }

    /// Number of token ids.
    pub fn len(&self) -> usize {
        match self {
            Tokenizer::Bytes(b) => b.vocab.len(),
            Tokenizer::HuggingFace(_, n) => *n,
        }
    }

    /// Never true for a constructed tokenizer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token ids of `text`.
    ///
    /// # Errors
    /// Text that is not UTF-8 (Hugging Face tokenizers read text), a byte outside the byte
    /// tokenizer's vocabulary, or an id outside the vocabulary.
    pub fn encode(&self, text: &[u8]) -> Result<Vec<u32>, DataError> {
        match self {
            Tokenizer::Bytes(b) => text
                .iter()
                .enumerate()
                .map(|(offset, byte)| {
                    b.index[*byte as usize]
                        .map(u32::from)
                        .ok_or(DataError::OutOfVocabulary {
                            byte: *byte,
                            offset,
                        })
                })
                .collect(),
            Tokenizer::HuggingFace(t, n) => {
                let text =
                    std::str::from_utf8(text).map_err(|e| DataError::NotUtf8(e.valid_up_to()))?;
                let enc = t
                    .encode_fast(text, false)
                    .map_err(|e| DataError::Tokenizer(e.to_string()))?;
                let ids = enc.get_ids();
                if let Some(bad) = ids.iter().find(|id| **id as usize >= *n) {
                    return Err(DataError::Tokenizer(format!(
                        "the tokenizer gave id {bad}, beyond its {n} tokens"
                    )));
                }
                Ok(ids.to_vec())
            }
        }
    }

    /// Text of token ids (ids outside the vocabulary become '?' or are skipped).
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Tokenizer::Bytes(b) => {
                let bytes: Vec<u8> = tokens
                    .iter()
                    .map(|t| b.vocab.get(*t as usize).copied().unwrap_or(b'?'))
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Tokenizer::HuggingFace(t, n) => {
                let ids: Vec<u32> = tokens
                    .iter()
                    .copied()
                    .filter(|i| (*i as usize) < *n)
                    .collect();
                t.decode(&ids, false).unwrap_or_default()
            }
        }
    }
}
