//! A swarm's data: the dataset a manifest pins (files by size and SHA-256, a `tokenizer.json`),
//! built from the creator's files and found again, checked, on every node.

use nightshift_model::Tokenizer;
use nightshift_model::data::{EMBEDDED_CORPUS, EMBEDDED_NAME};
use nightshift_model::dataset::{
    self, DataFile as FileRef, Dataset, Format, MAX_LINE_BYTES, Source, check_json_line,
};
use nightshift_model::tokenizer::MAX_TOKENIZER_BYTES;
use nightshift_protocol::Hash32;
use nightshift_protocol::manifest::{DataFile, DataSpec, MAX_DATA_FILES};
use sha2::{Digest, Sha256};
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::GenesisError;

/// File names a dataset directory's files may have: text, or JSON lines.
const DATA_EXTENSIONS: &[&str] = &["txt", "text", "md", "jsonl"];
/// Most validation text read (the held-out tail beyond it is not used).
pub const VAL_MAX_BYTES: u64 = 8 << 20;

fn io_err(path: &Path, source: std::io::Error) -> GenesisError {
    GenesisError::ReadCorpus {
        path: path.display().to_string(),
        source,
    }
}

fn bad(path: &Path, why: impl Into<String>) -> GenesisError {
    GenesisError::BadData {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// The files of a dataset at `root` (a file, or a directory searched for text and JSON-lines
/// files, hidden ones left out), with their paths relative to it, in stream order.
fn list_files(root: &Path) -> Result<Vec<(String, PathBuf)>, GenesisError> {
    let meta = std::fs::metadata(root).map_err(|e| io_err(root, e))?;
    if meta.is_file() {
        return Ok(vec![(String::new(), root.to_path_buf())]);
    }
    let mut out = vec![];
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| io_err(&dir, e))? {
            let entry = entry.map_err(|e| io_err(&dir, e))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let kind = entry.file_type().map_err(|e| io_err(&path, e))?;
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file()
                && path
                    .extension()
                    .is_some_and(|e| DATA_EXTENSIONS.contains(&&*e.to_string_lossy()))
            {
                let rel = path
                    .strip_prefix(root)
                    .expect("under root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                out.push((rel, path));
            }
        }
        if out.len() > MAX_DATA_FILES {
            return Err(bad(root, format!("more than {MAX_DATA_FILES} data files")));
        }
    }
    if out.is_empty() {
        return Err(bad(
            root,
            format!(
                "the directory holds no data files (*.{})",
                DATA_EXTENSIONS.join(", *.")
            ),
        ));
    }
    out.sort();
    Ok(out)
}

/// Checks that a file is what its format needs (UTF-8 text; JSON lines with a `text` field,
/// no line over [`MAX_LINE_BYTES`]), reading it in pieces, and returns its size and hash.
fn check_file(path: &Path, format: Format) -> Result<(u64, Hash32), GenesisError> {
    let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut line_no = 0u64;
    let mut offset = 0u64;
    let mut line = Vec::new();
    // The start of a character cut off at the end of the last piece read.
    let mut carry = Vec::new();
    // The hash is taken in the same pass, over the bytes as they are read.
    let mut sha = Sha256::new();
    let mut bytes = 0u64;
    loop {
        line.clear();
        line.append(&mut carry);
        let carried = line.len();
        let n = (&mut reader)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| io_err(path, e))?;
        sha.update(&line[carried..]);
        bytes += n as u64;
        if n == 0 {
            if !line.is_empty() {
                return Err(bad(path, "not UTF-8 text (it ends inside a character)"));
            }
            break;
        }
        line_no += 1;
        if let Err(e) = std::str::from_utf8(&line) {
            let cut_short = e.error_len().is_none() && !line.ends_with(b"\n");
            if !cut_short || format == Format::JsonLines {
                return Err(bad(
                    path,
                    format!(
                        "not UTF-8 text (invalid byte at offset {})",
                        offset + e.valid_up_to() as u64
                    ),
                ));
            }
            carry = line.split_off(e.valid_up_to());
        }
        if format == Format::JsonLines {
            if n as u64 > MAX_LINE_BYTES {
                return Err(bad(
                    path,
                    format!("line {line_no} is longer than {MAX_LINE_BYTES} bytes"),
                ));
            }
            check_json_line(&line).map_err(|e| bad(path, format!("line {line_no} {e}")))?;
        }
        offset += line.len() as u64;
    }
    Ok((bytes, Hash32(sha.finalize().into())))
}

/// What `swarm init` pins: the dataset at `data` (the embedded corpus for `None`), checked, and
/// the tokenizer (`tokenizer.json` at `tokenizer`, or the byte tokenizer over the data's bytes).
pub struct BuiltData {
    pub spec: DataSpec,
    pub dataset: Dataset,
    pub tokenizer: Tokenizer,
}

/// Reads and checks the creator's dataset and tokenizer.
///
/// # Errors
/// Unreadable or malformed files, a tokenizer that does not load.
pub fn build_data(
    data: Option<&Path>,
    tokenizer: Option<&Path>,
    val_permille: u32,
) -> Result<BuiltData, GenesisError> {
    let (name, listed) = match data {
        None => (EMBEDDED_NAME.to_string(), None),
        Some(p) => (p.display().to_string(), Some(list_files(p)?)),
    };
    let (files, refs) = match &listed {
        None => (
            vec![DataFile {
                path: String::new(),
                bytes: EMBEDDED_CORPUS.len() as u64,
                sha256: Hash32::of(&[EMBEDDED_CORPUS]),
            }],
            vec![FileRef {
                source: Source::Memory(Arc::from(EMBEDDED_CORPUS)),
                bytes: EMBEDDED_CORPUS.len() as u64,
                format: Format::Text,
            }],
        ),
        Some(list) => {
            let mut files = vec![];
            let mut refs = vec![];
            for (rel, path) in list {
                let format = Format::of_name(&path.to_string_lossy());
                let (bytes, sha256) = check_file(path, format)?;
                files.push(DataFile {
                    path: rel.clone(),
                    bytes,
                    sha256,
                });
                refs.push(FileRef {
                    source: Source::Path(path.clone()),
                    bytes,
                    format,
                });
            }
            (files, refs)
        }
    };
    let (tok, tok_file) = match tokenizer {
        Some(p) => {
            let (json, sha256) = read_tokenizer(p)?;
            let tok = Tokenizer::from_json(&json)?;
            let file = DataFile {
                path: p.display().to_string(),
                bytes: json.len() as u64,
                sha256,
            };
            (tok, Some(file))
        }
        None => (byte_tokenizer(&refs)?, None),
    };
    // Shards are sized once the recipe is known; the caller sets `shard_bytes`.
    let spec = DataSpec {
        name,
        files,
        val_permille,
        shard_bytes: 1 << 20,
        shards_per_round: 1,
        tokenizer: tok_file,
    };
    let dataset = Dataset::new(refs, val_permille, spec.shard_bytes)
        .map_err(|e| io_err(Path::new(&spec.name), e))?;
    Ok(BuiltData {
        spec,
        dataset,
        tokenizer: tok,
    })
}

/// The byte tokenizer over every byte of the dataset's text (and the document separator).
fn byte_tokenizer(refs: &[FileRef]) -> Result<Tokenizer, GenesisError> {
    let mut seen = [false; 256];
    for b in dataset::DOCUMENT_SEPARATOR {
        seen[*b as usize] = true;
    }
    // One dataset over all files, cut into pieces that are read one at a time.
    let all =
        Dataset::new(refs.to_vec(), 0, 16 << 20).map_err(|e| io_err(Path::new("dataset"), e))?;
    for i in 0..all.shard_count() {
        let text = all
            .shard_text(i)
            .map_err(|e| io_err(Path::new("dataset"), e))?;
        text.iter().for_each(|b| seen[*b as usize] = true);
    }
    let vocab: Vec<u8> = (0..=255u8).filter(|b| seen[*b as usize]).collect();
    Ok(Tokenizer::from_vocab(vocab)?)
}

fn read_tokenizer(p: &Path) -> Result<(Vec<u8>, Hash32), GenesisError> {
    let len = std::fs::metadata(p).map_err(|e| io_err(p, e))?.len();
    if len > MAX_TOKENIZER_BYTES as u64 {
        return Err(bad(
            p,
            format!("a tokenizer.json of {len} bytes; at most {MAX_TOKENIZER_BYTES} are read"),
        ));
    }
    let json = std::fs::read(p).map_err(|e| io_err(p, e))?;
    let sha = Hash32::of(&[&json]);
    Ok((json, sha))
}

/// A node's copy of the swarm's data, checked against the manifest: the dataset to stream from
/// and the tokenizer.
///
/// # Errors
/// A file that is missing, unreadable, or not the one the manifest pins (say which and where).
pub fn load_data(
    spec: &DataSpec,
    model_vocab: &[u8],
    vocab_size: u32,
    data: Option<&Path>,
    tokenizer: Option<&Path>,
) -> Result<(Dataset, Tokenizer), GenesisError> {
    let embedded = data.is_none() && spec.name == EMBEDDED_NAME;
    let root = data.map_or_else(|| PathBuf::from(&spec.name), Path::to_path_buf);
    let mut refs = vec![];
    for f in &spec.files {
        if embedded {
            check_hash(Path::new(EMBEDDED_NAME), f, Hash32::of(&[EMBEDDED_CORPUS]))?;
            refs.push(FileRef {
                source: Source::Memory(Arc::from(EMBEDDED_CORPUS)),
                bytes: f.bytes,
                format: Format::Text,
            });
            continue;
        }
        let path = if f.path.is_empty() {
            root.clone()
        } else {
            root.join(&f.path)
        };
        let meta = std::fs::metadata(&path).map_err(|e| io_err(&path, e))?;
        if meta.len() != f.bytes {
            return Err(GenesisError::CorpusMismatch {
                path: path.display().to_string(),
                got: format!("{} bytes", meta.len()),
                expected: format!("{} bytes", f.bytes),
            });
        }
        let (_, sha) = dataset::hash_file(&path).map_err(|e| io_err(&path, e))?;
        check_hash(&path, f, Hash32(sha))?;
        refs.push(FileRef {
            format: Format::of_name(&path.to_string_lossy()),
            source: Source::Path(path),
            bytes: f.bytes,
        });
    }
    let (tok, _) = load_tokenizer(spec, model_vocab, vocab_size, tokenizer)?;
    let dataset =
        Dataset::new(refs, spec.val_permille, spec.shard_bytes).map_err(|e| io_err(&root, e))?;
    Ok((dataset, tok))
}

/// The swarm's tokenizer, checked against the manifest, with the `tokenizer.json` it was read
/// from (`None` for the byte tokenizer).
///
/// # Errors
/// A `tokenizer.json` that is missing, unreadable or not the one the manifest pins.
pub fn load_tokenizer(
    spec: &DataSpec,
    model_vocab: &[u8],
    vocab_size: u32,
    tokenizer: Option<&Path>,
) -> Result<(Tokenizer, Option<Vec<u8>>), GenesisError> {
    let (tok, json) = match &spec.tokenizer {
        None => (Tokenizer::from_vocab(model_vocab.to_vec())?, None),
        Some(t) => {
            let p = tokenizer.map_or_else(|| PathBuf::from(&t.path), Path::to_path_buf);
            let (json, sha) = read_tokenizer(&p)?;
            check_hash(&p, t, sha)?;
            (Tokenizer::from_json(&json)?, Some(json))
        }
    };
    if tok.len() != vocab_size as usize {
        return Err(GenesisError::Model(format!(
            "the tokenizer has {} tokens, the model {vocab_size}",
            tok.len()
        )));
    }
    Ok((tok, json))
}

fn check_hash(path: &Path, f: &DataFile, got: Hash32) -> Result<(), GenesisError> {
    if got == f.sha256 {
        Ok(())
    } else {
        Err(GenesisError::CorpusMismatch {
            path: path.display().to_string(),
            got: got.short(),
            expected: f.sha256.short(),
        })
    }
}
