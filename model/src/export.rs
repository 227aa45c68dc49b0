//! The model in Hugging Face's GPT-2 layout, so that `transformers.GPT2LMHeadModel` loads what a
//! swarm trained: tensor names and shapes for a safetensors file, the `config.json`, and a
//! `tokenizer.json` that encodes text exactly as [`crate::Tokenizer`] does.
//!
//! [`crate::Gpt`] is GPT-2's architecture at other sizes: learned positions, pre-LayerNorm blocks
//! (ε = 1e-5), fused Q/K/V, the exact (erf) GELU, a final LayerNorm and an untied head without a
//! bias. burn's `Linear` stores its weight as `[in, out]`, as GPT-2's `Conv1D` does, so only the
//! head (`nn.Linear`, `[out, in]`) is transposed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::backend::{Cpu, cpu_device};
use crate::{GptConfig, flat};

/// Why an export could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the parameter vector has {got} values, the model has {expected}")]
    Length { got: usize, expected: usize },
    #[error("unexpected parameter {0} (this build's model has no GPT-2 name for it)")]
    Unmapped(String),
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("the safetensors file has no tensor {0}")]
    Missing(String),
    #[error("tensor {name} has shape {got:?}, the config says {expected:?}")]
    Shape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
}

/// One tensor under its GPT-2 name.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Our parameter's GPT-2 name, and whether it is stored transposed there.
fn gpt2_name(ours: &str) -> Option<(String, bool)> {
    let parts: Vec<&str> = ours.split('.').collect();
    let leaf = |l: &str| match l {
        "gamma" | "weight" => Some("weight"),
        "beta" | "bias" => Some("bias"),
        _ => None,
    };
    Some(match parts.as_slice() {
        ["tok", "weight"] => ("transformer.wte.weight".into(), false),
        ["pos", "weight"] => ("transformer.wpe.weight".into(), false),
        ["norm", l] => (format!("transformer.ln_f.{}", leaf(l)?), false),
        ["head", "weight"] => ("lm_head.weight".into(), true),
        ["blocks", i, module, l] => {
            let i: usize = i.parse().ok()?;
            let theirs = match *module {
                "norm_attn" => "ln_1",
                "qkv" => "attn.c_attn",
                "proj" => "attn.c_proj",
                "norm_ff" => "ln_2",
                "ff_in" => "mlp.c_fc",
                "ff_out" => "mlp.c_proj",
                _ => return None,
            };
            (format!("transformer.h.{i}.{theirs}.{}", leaf(l)?), false)
        }
        _ => return None,
    })
}

/// Our parameters' names, shapes and GPT-2 names, in the flat vector's order.
fn layout(cfg: &GptConfig) -> Result<Vec<(String, Vec<usize>, bool)>, ExportError> {
    let model = cfg.init::<Cpu>(&cpu_device());
    let names = flat::param_names::<Cpu, _>(&model);
    let shapes = flat::param_shapes::<Cpu, _>(&model);
    names
        .into_iter()
        .zip(shapes)
        .map(|((ours, _), shape)| {
            let (theirs, t) = gpt2_name(&ours).ok_or(ExportError::Unmapped(ours))?;
            Ok((theirs, shape, t))
        })
        .collect()
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// `params` (a state's θ) as GPT-2's tensors.
///
/// # Errors
/// A vector of the wrong length.
pub fn to_gpt2(cfg: &GptConfig, params: &[f32]) -> Result<Vec<NamedTensor>, ExportError> {
    let layout = layout(cfg)?;
    let expected: usize = layout
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>())
        .sum();
    if params.len() != expected {
        return Err(ExportError::Length {
            got: params.len(),
            expected,
        });
    }
    let mut at = 0;
    let mut out = vec![];
    for (name, shape, t) in layout {
        let n: usize = shape.iter().product();
        let data = &params[at..at + n];
        at += n;
        out.push(if t {
            NamedTensor {
                name,
                shape: vec![shape[1], shape[0]],
                data: transpose(data, shape[0], shape[1]),
            }
        } else {
            NamedTensor {
                name,
                shape,
                data: data.to_vec(),
            }
        });
    }
    Ok(out)
}

/// GPT-2's tensors back into our flat parameter vector (the inverse of [`to_gpt2`]).
///
/// # Errors
/// A tensor missing, or of another shape than `cfg` gives it.
pub fn from_gpt2(
    cfg: &GptConfig,
    tensors: &HashMap<String, NamedTensor>,
) -> Result<Vec<f32>, ExportError> {
    let mut out = vec![];
    for (name, shape, t) in layout(cfg)? {
        let x = tensors
            .get(&name)
            .ok_or_else(|| ExportError::Missing(name.clone()))?;
        let want = if t {
            vec![shape[1], shape[0]]
        } else {
            shape.clone()
        };
        if x.shape != want {
            return Err(ExportError::Shape {
                name,
                got: x.shape.clone(),
                expected: want,
            });
        }
        if t {
            out.extend(transpose(&x.data, shape[1], shape[0]));
        } else {
            out.extend_from_slice(&x.data);
        }
    }
    Ok(out)
}

/// Writes `tensors` as a safetensors file (f32, little-endian) with `metadata`
/// (`format: pt` added, which `transformers` requires).
///
/// # Errors
/// The file cannot be written.
pub fn write_safetensors(
    path: &Path,
    tensors: &[NamedTensor],
    metadata: BTreeMap<String, String>,
) -> Result<(), ExportError> {
    let file_err = |reason: String| ExportError::File {
        path: path.display().to_string(),
        reason,
    };
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.data.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), b)
                .map(|v| (t.name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(e.to_string()))?;
    let mut meta: HashMap<String, String> = metadata.into_iter().collect();
    meta.insert("format".into(), "pt".into());
    safetensors::tensor::serialize_to_file(views, Some(meta), path)
        .map_err(|e| file_err(e.to_string()))
}

/// Reads every f32 tensor of a safetensors file.
///
/// # Errors
/// A file that cannot be read, is not safetensors, or holds a tensor that is not f32.
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, NamedTensor>, ExportError> {
    let file_err = |reason: String| ExportError::File {
        path: path.display().to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| file_err(e.to_string()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| file_err(e.to_string()))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(file_err(format!(
                "tensor {name} is {:?}; this reads f32 only",
                view.dtype()
            )));
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert(
            name.clone(),
            NamedTensor {
                name,
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(out)
}

/// `config.json` for `transformers.GPT2LMHeadModel.from_pretrained`.
pub fn gpt2_config(cfg: &GptConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab,
        "n_positions": cfg.seq_len,
        "n_ctx": cfg.seq_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff,
        "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": true,
        "tie_word_embeddings": false,
        "bos_token_id": null,
        "eos_token_id": null,
        "torch_dtype": "float32",
    })
}

/// The model's size as written in a `config.json` by [`gpt2_config`].
///
/// # Errors
/// A field missing or out of range.
pub fn config_from_gpt2(v: &serde_json::Value) -> Result<GptConfig, String> {
    let field = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_u64)
            .filter(|n| (1..=1 << 20).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| format!("config.json: no valid \"{k}\""))
    };
    let vocab = field("vocab_size")?;
    let cfg = GptConfig::new(vocab)
        .with_d_model(field("n_embd")?)
        .with_n_layers(field("n_layer")?)
        .with_n_heads(field("n_head")?)
        .with_d_ff(field("n_inner")?)
        .with_seq_len(field("n_positions")?);
    if !cfg.d_model.is_multiple_of(cfg.n_heads) {
        return Err(format!(
            "config.json: n_embd {} is not a multiple of n_head {}",
            cfg.d_model, cfg.n_heads
        ));
    }
    // Checked before anything is allocated: a model this size would not fit in memory.
    let (d, f) = (cfg.d_model as u128, cfg.d_ff as u128);
    let per_layer = 4 * d + 4 * d * d + 4 * d + 2 * d * f + f + d;
    let params =
        (2 * vocab as u128 + cfg.seq_len as u128) * d + 2 * d + cfg.n_layers as u128 * per_layer;
    if params > 1 << 33 {
        return Err(format!(
            "config.json describes {params} parameters; at most 2^33 are read"
        ));
    }
    Ok(cfg)
}

/// The printable character GPT-2's byte-level encoding writes for each byte.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        out[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + extra).expect("in range");
            extra += 1;
            c
        };
    }
    out
}

/// A Hugging Face `tokenizer.json` that turns text into the ids the byte tokenizer over `vocab`
/// ([`crate::Tokenizer::from_vocab`]) gives: a byte-level pre-tokenizer (each byte as one character, no
/// splitting) and a BPE model without merges whose vocabulary is the swarm's bytes in token
/// order. (A swarm with its own `tokenizer.json` exports that file as it is.)
pub fn tokenizer_json(vocab: &[u8]) -> serde_json::Value {
    let chars = byte_chars();
    let vocab: serde_json::Map<String, serde_json::Value> = vocab
        .iter()
        .enumerate()
        .map(|(id, b)| (chars[*b as usize].to_string(), serde_json::json!(id)))
        .collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false,
    });
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "vocab": vocab,
            "merges": [],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;

    #[test]
    fn every_parameter_has_a_gpt2_name_and_the_round_trip_is_exact() {
        let cfg = GptConfig::preset("tiny", 40).unwrap().with_n_layers(2);
        let model = cfg.init::<Cpu>(&cpu_device());
        let params = flat::genesis_params::<Cpu, _>(&model, 7);
        let tensors = to_gpt2(&cfg, &params).unwrap();
        let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        for want in [
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.h.1.attn.c_attn.weight",
            "transformer.h.1.mlp.c_proj.bias",
            "transformer.ln_f.weight",
            "lm_head.weight",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let head = tensors.iter().find(|t| t.name == "lm_head.weight").unwrap();
        assert_eq!(head.shape, vec![40, 32], "nn.Linear stores [out, in]");
        let c_attn = tensors
            .iter()
            .find(|t| t.name == "transformer.h.0.attn.c_attn.weight")
            .unwrap();
        assert_eq!(c_attn.shape, vec![32, 96], "Conv1D stores [in, out]");
        let dir = std::env::temp_dir().join(format!("nightshift-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        write_safetensors(&path, &tensors, BTreeMap::new()).unwrap();
        let back = from_gpt2(&cfg, &read_safetensors(&path).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back, params);
        let cfg2 = config_from_gpt2(&gpt2_config(&cfg)).unwrap();
        assert_eq!(cfg2, cfg);
    }

    #[test]
    fn a_config_json_too_large_or_inconsistent_is_refused_before_allocating() {
        let mut v = gpt2_config(&GptConfig::preset("tiny", 40).unwrap());
        v["n_layer"] = serde_json::json!(1 << 20);
        v["n_embd"] = serde_json::json!(1 << 16);
        v["n_head"] = serde_json::json!(1);
        assert!(config_from_gpt2(&v).unwrap_err().contains("parameters"));
        let mut v = gpt2_config(&GptConfig::preset("tiny", 40).unwrap());
        v["n_head"] = serde_json::json!(3);
        assert!(config_from_gpt2(&v).unwrap_err().contains("multiple"));
        v["vocab_size"] = serde_json::json!((1 << 20) + 1);
        assert!(config_from_gpt2(&v).is_err());
    }

    #[test]
    fn the_tokenizer_json_maps_each_byte_to_its_id() {
        let tok = Tokenizer::from_corpus("hello, world\n\u{e9}".as_bytes());
        let v = tokenizer_json(tok.byte_vocab().unwrap());
        let vocab = v["model"]["vocab"].as_object().unwrap();
        assert_eq!(vocab.len(), tok.len());
        // GPT-2's byte-level alphabet: a newline is Ċ, a space Ġ, printable ASCII itself.
        let ids = tok.encode(b"\n ,").unwrap();
        assert_eq!(vocab["\u{10a}"], ids[0] as u64);
        assert_eq!(vocab["\u{120}"], ids[1] as u64);
        assert_eq!(vocab[","], ids[2] as u64);
        let chars = byte_chars();
        let distinct: std::collections::BTreeSet<char> = chars.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
