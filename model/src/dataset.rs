//! A dataset of many files, streamed in shards: each round a node reads one shard of the
//! training part from disk (chosen from its key and the round), tokenizes it and trains on it;
//! nothing holds the whole dataset in memory.
//!
//! The files are one stream in their listed order. The last `val_permille` thousandths of the
//! stream are held out for validation; the training part of each file is cut into equal shards
//! of at most `shard_bytes` (a shard never spans two files). Cuts fall on character boundaries
//! in text files and on line boundaries in JSON-lines files (one document per line, its `text`
//! field), so that no shard starts inside a character or a document.

use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

/// How a file's bytes become text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// UTF-8 text, used as it is.
    Text,
    /// One JSON object per line; its `text` field is a document.
    JsonLines,
}

impl Format {
    /// The format a file name implies: `.jsonl` is JSON lines, anything else text.
    pub fn of_name(name: &str) -> Format {
        if name.ends_with(".jsonl") {
            Format::JsonLines
        } else {
            Format::Text
        }
    }
}

/// Where a file's bytes are.
#[derive(Clone, Debug)]
pub enum Source {
    Path(PathBuf),
    Memory(Arc<[u8]>),
}

/// One file of a dataset.
#[derive(Clone, Debug)]
pub struct DataFile {
    pub source: Source,
    pub bytes: u64,
    pub format: Format,
}

/// A byte range of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub file: usize,
    pub start: u64,
    pub end: u64,
}

/// Documents are joined by this in the token stream.
pub const DOCUMENT_SEPARATOR: &[u8] = b"\n\n";
/// The longest line a JSON-lines file may hold.
pub const MAX_LINE_BYTES: u64 = 16 << 20;

/// One file's part of the training shards.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// The file's bytes before the validation tail (a nominal cut).
    train: u64,
    /// `train`, moved to a clean cut.
    cut: u64,
    /// Its shards, and the index of the first.
    shards: u64,
    first: u64,
}

/// A dataset's files, cut into training shards and a validation tail. The shards' cuts are
/// found when a shard is read, so a dataset of millions of shards costs memory per file only.
#[derive(Clone, Debug)]
pub struct Dataset {
    files: Vec<DataFile>,
    plans: Vec<Plan>,
    shard_count: u64,
    val: Vec<Span>,
}

impl Dataset {
    /// Cuts `files` into shards of at most `shard_bytes` and a validation tail of
    /// `val_permille` thousandths. Reads each file's bytes only around the validation cut.
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn new(files: Vec<DataFile>, val_permille: u32, shard_bytes: u64) -> std::io::Result<Self> {
        let total: u64 = files.iter().map(|f| f.bytes).sum();
        let val_bytes = total * u64::from(val_permille.min(999)) / 1000;
        let train_end = total - val_bytes;
        let mut d = Dataset {
            files,
            plans: vec![],
            shard_count: 0,
            val: vec![],
        };
        let shard_bytes = shard_bytes.max(1);
        let mut offset = 0u64;
        for i in 0..d.files.len() {
            let len = d.files[i].bytes;
            // This file's bytes before the validation tail.
            let train = train_end.saturating_sub(offset).min(len);
            let cut = d.align(i, train)?;
            let shards = if cut > 0 {
                train.div_ceil(shard_bytes).max(1)
            } else {
                0
            };
            d.plans.push(Plan {
                train,
                cut,
                shards,
                first: d.shard_count,
            });
            d.shard_count += shards;
            if cut < len {
                d.val.push(Span {
                    file: i,
                    start: cut,
                    end: len,
                });
            }
            offset += len;
        }
        Ok(d)
    }

    /// How many training shards there are.
    pub fn shard_count(&self) -> usize {
        self.shard_count as usize
    }

    /// Where training shard `i` lies (it may be empty, where cuts fall together).
    ///
    /// # Errors
    /// A file that cannot be read, or an index out of range.
    pub fn shard_span(&self, i: usize) -> std::io::Result<Span> {
        let i = i as u64;
        if i >= self.shard_count {
            return Err(std::io::Error::other(format!(
                "shard {i} of a dataset of {} shards",
                self.shard_count
            )));
        }
        let file = self.plans.partition_point(|p| p.first + p.shards <= i);
        let p = self.plans[file];
        let k = i - p.first;
        let at = |k: u64| -> std::io::Result<u64> {
            if k == 0 {
                Ok(0)
            } else if k == p.shards {
                Ok(p.cut)
            } else {
                Ok(self.align(file, p.train * k / p.shards)?.min(p.cut))
            }
        };
        Ok(Span {
            file,
            start: at(k)?,
            end: at(k + 1)?,
        })
    }

    /// The validation tail.
    pub fn val_spans(&self) -> &[Span] {
        &self.val
    }

    /// The files.
    pub fn files(&self) -> &[DataFile] {
        &self.files
    }

    /// The text of training shard `i` (documents of JSON lines joined by
    /// [`DOCUMENT_SEPARATOR`]).
    ///
    /// # Errors
    /// A file that cannot be read, or a shard index out of range.
    pub fn shard_text(&self, i: usize) -> std::io::Result<Vec<u8>> {
        self.text(self.shard_span(i)?)
    }

    /// The text of the validation tail's first `max_bytes` (or so: whole documents).
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn val_text(&self, max_bytes: u64) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        for span in &self.val {
            if out.len() as u64 >= max_bytes {
                break;
            }
            let left = max_bytes - out.len() as u64;
            let end = if span.end - span.start > left {
                self.align(span.file, span.start + left)?
            } else {
                span.end
            };
            if !out.is_empty() {
                out.extend_from_slice(DOCUMENT_SEPARATOR);
            }
            out.extend(self.text(Span { end, ..*span })?);
        }
        Ok(out)
    }

    /// The text of `span`.
    fn text(&self, span: Span) -> std::io::Result<Vec<u8>> {
        let bytes = self.read(span.file, span.start, span.end)?;
        Ok(match self.files[span.file].format {
            Format::Text => bytes,
            Format::JsonLines => {
                let mut out = Vec::with_capacity(bytes.len());
                for doc in bytes.split(|b| *b == b'\n').filter_map(document) {
                    if !out.is_empty() {
                        out.extend_from_slice(DOCUMENT_SEPARATOR);
                    }
                    out.extend_from_slice(doc.as_bytes());
                }
                out
            }
        })
    }

    /// Bytes `start..end` of file `i`.
    fn read(&self, i: usize, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
        let f = &self.files[i];
        let end = end.min(f.bytes);
        let start = start.min(end);
        match &f.source {
            Source::Memory(b) => Ok(b[start as usize..end as usize].to_vec()),
            Source::Path(p) => {
                let mut file = std::fs::File::open(p)?;
                file.seek(SeekFrom::Start(start))?;
                let mut out = Vec::with_capacity((end - start) as usize);
                file.take(end - start).read_to_end(&mut out)?;
                if (out.len() as u64) < end - start {
                    return Err(std::io::Error::other(format!(
                        "{} is shorter than the dataset says ({} bytes)",
                        p.display(),
                        f.bytes
                    )));
                }
                Ok(out)
            }
        }
    }

    /// The first cut at or after `pos` in file `i`: the next character boundary of a text file,
    /// the next line start of a JSON-lines file (the file's length when there is none).
    fn align(&self, i: usize, pos: u64) -> std::io::Result<u64> {
        let f = &self.files[i];
        if pos == 0 || pos >= f.bytes {
            return Ok(pos.min(f.bytes));
        }
        let mut at = pos;
        let mut step = 1 << 10;
        while at < f.bytes && at - pos <= MAX_LINE_BYTES {
            // For a line start, look from the byte before `pos`.
            let from = if f.format == Format::JsonLines && at == pos {
                at - 1
            } else {
                at
            };
            let chunk = self.read(i, from, (from + step).min(f.bytes))?;
            let found = match f.format {
                Format::Text => chunk.iter().position(|b| (b & 0xC0) != 0x80),
                Format::JsonLines => chunk.iter().position(|b| *b == b'\n').map(|p| p + 1),
            };
            if let Some(p) = found {
                return Ok((from + p as u64).min(f.bytes));
            }
            at = from + chunk.len() as u64;
            step = (step * 2).min(1 << 20);
        }
        Ok(at.min(f.bytes))
    }
}

/// The `text` field of one JSON line; `None` for a blank or malformed line.
fn document(line: &[u8]) -> Option<String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    Some(v.get("text")?.as_str()?.to_owned())
}

/// Why a line of a JSON-lines file is not a document, if it is not (blank lines are fine).
pub fn check_json_line(line: &[u8]) -> Result<(), String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    match v.get("text") {
        Some(serde_json::Value::String(_)) => Ok(()),
        _ => Err("has no \"text\" string field".into()),
    }
}

/// The `draw`-th training shard a node with `seed` (its public key) trains on in `round`, of
/// `n`: drawn anew every round, so that every node sees the whole training part over the rounds
/// and the nodes of a round train on different parts.
pub fn shard_for(seed: &[u8], round: u64, draw: u32, n: usize) -> usize {
    let h = Sha256::new()
        .chain_update(b"nightshift/shard/v1\0")
        .chain_update(seed)
        .chain_update(round.to_le_bytes())
        .chain_update(draw.to_le_bytes())
        .finalize();
    let x = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
    (x % n.max(1) as u64) as usize
}

/// The size and SHA-256 of a file, read in pieces.
///
/// # Errors
/// A file that cannot be read.
pub fn hash_file(path: &std::path::Path) -> std::io::Result<(u64, [u8; 32])> {
    let mut file = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, h.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(text: &str, format: Format) -> DataFile {
        DataFile {
            source: Source::Memory(Arc::from(text.as_bytes())),
            bytes: text.len() as u64,
            format,
        }
    }

    #[test]
    fn shards_and_the_validation_tail_partition_the_stream_at_clean_cuts() {
        let a = "ab\u{e9}cd".repeat(400); // 2,400 bytes with two-byte characters
        let lines: String = (0..50)
            .map(|i| format!("{{\"text\": \"doc {i}\"}}\n"))
            .collect();
        let d = Dataset::new(
            vec![mem(&a, Format::Text), mem(&lines, Format::JsonLines)],
            200,
            500,
        )
        .unwrap();
        // File 0 is all training (5 shards); the validation tail lies in file 1.
        let spans: Vec<Span> = (0..d.shard_count())
            .map(|i| d.shard_span(i).unwrap())
            .collect();
        assert_eq!(spans.iter().filter(|s| s.file == 0).count(), 5);
        let mut covered = vec![0u64; 2];
        for s in spans.iter().chain(d.val_spans()) {
            assert_eq!(s.start, covered[s.file], "spans are contiguous");
            covered[s.file] = s.end;
        }
        assert_eq!(covered, vec![a.len() as u64, lines.len() as u64]);
        for i in 0..d.shard_count() {
            let t = d.shard_text(i).unwrap();
            assert!(
                std::str::from_utf8(&t).is_ok(),
                "shard {i} cut inside a character"
            );
        }
        let json_shard = spans.iter().position(|s| s.file == 1).unwrap();
        let t = String::from_utf8(d.shard_text(json_shard).unwrap()).unwrap();
        assert!(t.starts_with("doc 0\n\ndoc 1"), "{t}");
        let v = String::from_utf8(d.val_text(1 << 20).unwrap()).unwrap();
        assert!(v.ends_with("doc 49"), "{v}");
    }

    #[test]
    fn malformed_lines_are_skipped_and_named_by_the_checker() {
        let d = Dataset::new(
            vec![mem(
                "{\"text\": \"a\"}\nnot json\n{\"x\": 1}\n\n{\"text\": \"b\"}\n",
                Format::JsonLines,
            )],
            1,
            4096,
        )
        .unwrap();
        assert_eq!(d.shard_text(0).unwrap(), b"a\n\nb");
        assert!(
            check_json_line(b"not json")
                .unwrap_err()
                .contains("not JSON")
        );
        assert!(check_json_line(b"{\"x\": 1}").unwrap_err().contains("text"));
        assert!(check_json_line(b"  ").is_ok());
    }

    #[test]
    fn each_node_draws_a_new_shard_every_round_and_all_are_drawn() {
        let n = 7;
        let mut seen = vec![0; n];
        for r in 0..700 {
            seen[shard_for(b"key a", r, 0, n)] += 1;
        }
        assert!(seen.iter().all(|c| *c > 50), "{seen:?}");
        let differ = (0..100)
            .filter(|r| shard_for(b"key a", *r, 0, n) != shard_for(b"key b", *r, 0, n))
            .count();
        assert!(differ > 70, "{differ}");
        assert_eq!(shard_for(b"k", 3, 0, 1), 0);
        assert_ne!(
            (0..8)
                .map(|j| shard_for(b"k", 3, j, 1000))
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            1
        );
    }
}
