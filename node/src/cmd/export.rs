//! `nightshift export` (the swarm's model as Hugging Face GPT-2 files) and `nightshift sample`
//! (text generated from it).

use anyhow::{Context, bail};
use clap::Args;
use nightshift_model::backend::{Cpu, cpu_device};
use nightshift_model::export::{self, NamedTensor};
use nightshift_model::sample::{Sampling, generate};
use nightshift_model::{Corpus, Gpt, GptConfig, Tokenizer, flat};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::control;
use crate::store::Store;
use nightshift_protocol::wire;

/// The files an export holds.
const WEIGHTS: &str = "model.safetensors";
const CONFIG: &str = "config.json";
const TOKENIZER: &str = "tokenizer.json";
const ABOUT: &str = "nightshift.json";

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A node's data directory. While a node runs there (its database is locked), the state it
    /// holds now is asked of it through its control endpoint.
    #[arg(long, default_value = "nightshift-data")]
    pub data_dir: PathBuf,
    /// The directory to write (created if missing): model.safetensors, config.json,
    /// tokenizer.json and nightshift.json.
    #[arg(long)]
    pub out: PathBuf,
    /// The swarm's data, when it is not where the manifest says (used for the reference loss
    /// in nightshift.json only).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The swarm's `tokenizer.json`, when it has one and it is not where the manifest says.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct SampleArgs {
    /// A node's data directory to sample from (a running node's too, as for `export`).
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    pub data_dir: Option<PathBuf>,
    /// A directory written by `nightshift export`, instead of --data-dir.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The swarm's `tokenizer.json` (with --data-dir), when it has one and it is not where the
    /// manifest says.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The text to continue (default: a newline, or the vocabulary's first character).
    #[arg(long)]
    pub prompt: Option<String>,
    /// How many tokens to generate.
    #[arg(long, default_value_t = 300)]
    pub tokens: usize,
    /// Softmax temperature: lower is more predictable, 0 always takes the likeliest token.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Draw only from the K likeliest tokens (0: from all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Seed of the draws: the same seed, prompt and model print the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// A model and its tokenizer, from a data directory or an export.
struct Loaded {
    cfg: GptConfig,
    tok: Tokenizer,
    params: Vec<f32>,
}

/// What a node's data directory holds: its manifest and its latest state.
struct FromStore {
    manifest: nightshift_protocol::SignedManifest,
    state: nightshift_protocol::StateSnapshot,
}

async fn open_store(data_dir: &Path) -> anyhow::Result<FromStore> {
    let db = data_dir.join("db");
    if !db.is_dir() {
        bail!(
            "{} holds no node data (no db/): give the --data-dir a node ran with",
            data_dir.display()
        );
    }
    let store = match Store::open(&db) {
        Ok(store) => store,
        // A node running there holds the database: ask it for what it holds now.
        Err(e) if control::control_file(data_dir).exists() => {
            return from_running_node(data_dir).await.with_context(|| {
                format!(
                    "cannot open {} ({e}), and the node running there did not give its state",
                    data_dir.display()
                )
            });
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot open {}", data_dir.display()));
        }
    };
    let manifest = store
        .manifest()?
        .context("this data directory has joined no swarm yet")?;
    let state = store.checkpoint()?.unwrap_or_else(|| {
        // Joined but no round completed: the swarm's genesis state.
        nightshift_genesis::genesis_state(&manifest.manifest)
    });
    Ok(FromStore { manifest, state })
}

/// The manifest and current state of the node running on `data_dir`, which writes them to
/// `<data_dir>/snapshot/` when asked (`snapshot` on its control endpoint).
async fn from_running_node(data_dir: &Path) -> anyhow::Result<FromStore> {
    let said = control::call(data_dir, "snapshot").await?;
    let dir = data_dir.join(control::SNAPSHOT_DIR);
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let manifest: nightshift_protocol::SignedManifest =
        wire::decode(&read(control::SNAPSHOT_MANIFEST)?, usize::MAX)
            .context("the snapshot's manifest")?;
    let state: nightshift_protocol::StateSnapshot =
        wire::decode(&read(control::SNAPSHOT_STATE)?, usize::MAX)
            .context("the snapshot's state")?;
    if said["state_hash"].as_str() != Some(state.hash().to_hex().as_str()) {
        bail!("another snapshot replaced this one while it was read: try again");
    }
    Ok(FromStore { manifest, state })
}

/// The swarm's tokenizer, and its `tokenizer.json` when it has one.
fn tokenizer_of(
    m: &nightshift_protocol::Manifest,
    path: Option<&Path>,
) -> anyhow::Result<(Tokenizer, Option<Vec<u8>>)> {
    nightshift_genesis::load_tokenizer(&m.training.data, &m.model.vocab, m.model.vocab_size, path)
        .context("the swarm's tokenizer.json: give --tokenizer FILE")
}

async fn load_store(data_dir: &Path, tokenizer: Option<&Path>) -> anyhow::Result<Loaded> {
    let s = open_store(data_dir).await?;
    let m = &s.manifest.manifest;
    Ok(Loaded {
        cfg: nightshift_genesis::model_config(&m.model),
        tok: tokenizer_of(m, tokenizer)?.0,
        params: s.state.params,
    })
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn load_export(dir: &Path) -> anyhow::Result<Loaded> {
    let cfg = export::config_from_gpt2(&read_json(&dir.join(CONFIG))?)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{} is not a nightshift export", dir.display()))?;
    let about = read_json(&dir.join(ABOUT))?;
    let tok = match about.get("vocab") {
        // The byte tokenizer: its symbols, in token order.
        Some(v) => {
            let vocab: Vec<u8> = v
                .as_array()
                .context("nightshift.json: vocab must be a list")?
                .iter()
                .map(|v| v.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Option<_>>()
                .context("nightshift.json: vocab must list bytes (0-255)")?;
            Tokenizer::from_vocab(vocab)?
        }
        None => {
            let path = dir.join(TOKENIZER);
            let json =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            Tokenizer::from_json(&json).with_context(|| format!("{}", path.display()))?
        }
    };
    if tok.len() != cfg.vocab {
        bail!(
            "nightshift.json's vocabulary has {} tokens, config.json says {}",
            tok.len(),
            cfg.vocab
        );
    }
    let tensors: HashMap<String, NamedTensor> = export::read_safetensors(&dir.join(WEIGHTS))?;
    let params = export::from_gpt2(&cfg, &tensors)?;
    Ok(Loaded { cfg, tok, params })
}

fn model_of(l: &Loaded) -> anyhow::Result<Gpt<Cpu>> {
    let dev = cpu_device();
    Ok(flat::unflatten(l.cfg.init::<Cpu>(&dev), &l.params, &dev)?)
}

/// Writes the export.
///
/// # Errors
/// A data directory without a swarm, a running node that does not give its state, or an output
/// that cannot be written.
pub async fn run_export(a: ExportArgs) -> anyhow::Result<()> {
    let s = open_store(&a.data_dir).await?;
    let m = &s.manifest.manifest;
    let cfg = nightshift_genesis::model_config(&m.model);
    let (tok, tokenizer_json) = tokenizer_of(m, a.tokenizer.as_deref())?;
    let tensors = export::to_gpt2(&cfg, &s.state.params)?;
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let swarm = s.manifest.swarm_id().to_hex();
    let hash = s.state.hash().to_hex();
    let meta = BTreeMap::from([
        ("nightshift_swarm".to_string(), swarm.clone()),
        ("nightshift_round".to_string(), s.state.round.to_string()),
        ("nightshift_state_hash".to_string(), hash.clone()),
    ]);
    export::write_safetensors(&a.out.join(WEIGHTS), &tensors, meta)?;
    write_json(&a.out.join(CONFIG), &export::gpt2_config(&cfg))?;
    match (&tokenizer_json, tok.byte_vocab()) {
        // The swarm's own tokenizer.json, as it is.
        (Some(json), _) => std::fs::write(a.out.join(TOKENIZER), json)
            .with_context(|| format!("cannot write {}", a.out.join(TOKENIZER).display()))?,
        (None, Some(vocab)) => write_json(&a.out.join(TOKENIZER), &export::tokenizer_json(vocab))?,
        (None, None) => bail!("a tokenizer with neither a byte vocabulary nor a tokenizer.json"),
    }
    let check = reference_loss(m, &cfg, &tok, &s.state.params, &a);
    let mut about = serde_json::json!({
        "swarm": swarm,
        "name": m.name,
        "round": s.state.round,
        "state_hash": hash,
        "check": check,
    });
    if let Some(vocab) = tok.byte_vocab() {
        about["vocab"] = serde_json::json!(vocab);
    }
    write_json(&a.out.join(ABOUT), &about)?;
    println!(
        "exported round {} of swarm {} ({} parameters) to {}",
        s.state.round,
        m.name,
        s.state.params.len(),
        a.out.display()
    );
    println!(
        "load it with: transformers.GPT2LMHeadModel.from_pretrained({:?}) and \
         PreTrainedTokenizerFast(tokenizer_file={:?})",
        a.out.display().to_string(),
        a.out.join(TOKENIZER).display().to_string()
    );
    Ok(())
}

/// Some validation windows of the swarm's corpus with the model's loss on them, for checking an
/// export against another implementation; `null` when the corpus is not at hand.
fn reference_loss(
    m: &nightshift_protocol::Manifest,
    cfg: &GptConfig,
    tok: &Tokenizer,
    params: &[f32],
    a: &ExportArgs,
) -> serde_json::Value {
    let data = nightshift_genesis::load_data(
        &m.training.data,
        &m.model.vocab,
        m.model.vocab_size,
        a.data.as_deref(),
        a.tokenizer.as_deref(),
    )
    .map_err(anyhow::Error::from)
    .and_then(|(d, _)| Ok(d.val_text(nightshift_genesis::data::VAL_MAX_BYTES)?));
    let text = match data {
        Ok(t) => t,
        Err(e) => {
            eprintln!("note: no reference loss in nightshift.json ({e:#}); give --data PATH");
            return serde_json::Value::Null;
        }
    };
    let Ok(val) = tok.encode(&text) else {
        return serde_json::Value::Null;
    };
    if val.len() <= cfg.seq_len {
        return serde_json::Value::Null;
    }
    let corpus = Corpus::from_parts(vec![], val);
    let batches = corpus.val_batches(4, cfg.seq_len, 2);
    let l = Loaded {
        cfg: cfg.clone(),
        tok: tok.clone(),
        params: params.to_vec(),
    };
    let Ok(model) = model_of(&l) else {
        return serde_json::Value::Null;
    };
    let loss = nightshift_model::eval::val_loss(&model, &batches);
    let rows =
        |v: &Vec<i32>| -> Vec<Vec<i32>> { v.chunks(cfg.seq_len).map(<[i32]>::to_vec).collect() };
    serde_json::json!({
        "inputs": batches.iter().flat_map(|(x, _)| rows(x)).collect::<Vec<_>>(),
        "targets": batches.iter().flat_map(|(_, y)| rows(y)).collect::<Vec<_>>(),
        "loss": loss,
    })
}

fn write_json(path: &Path, v: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Prints the prompt and what the model writes after it.
///
/// # Errors
/// No model where the flags point, or a prompt with bytes outside the vocabulary.
pub async fn run_sample(a: SampleArgs) -> anyhow::Result<()> {
    let loaded = match (&a.data_dir, &a.model) {
        (Some(d), _) => load_store(d, a.tokenizer.as_deref()).await?,
        (None, Some(m)) => load_export(m)?,
        (None, None) => bail!("give --data-dir DIR or --model EXPORT"),
    };
    if !a.temperature.is_finite() || a.temperature < 0.0 {
        bail!("--temperature must be 0 or more");
    }
    let prompt = match (&a.prompt, loaded.tok.byte_vocab()) {
        (Some(p), _) if !p.is_empty() => p.clone(),
        (_, Some(vocab)) if !vocab.contains(&b'\n') => (vocab[0] as char).to_string(),
        _ => "\n".into(),
    };
    let ids = loaded.tok.encode(prompt.as_bytes()).map_err(|e| {
        anyhow::anyhow!(
            "the prompt cannot be encoded: {e} (a byte-level model knows only the bytes of its \
             corpus)"
        )
    })?;
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let model = model_of(&loaded)?;
    let out = generate(
        &model,
        &ids,
        a.tokens,
        Sampling {
            temperature: a.temperature,
            top_k: a.top_k,
            seed: a.seed,
        },
    );
    println!("{prompt}{}", loaded.tok.decode(&out));
    Ok(())
}
