//! `agentrl generate`: render the chat template of a model directory, sample a
//! continuation and print it.

use std::path::{Path, PathBuf};

use agentrl_model::{PolicyModel, Precision, SamplingParams};
use agentrl_tokenizer::{ChatMessage, ChatTokenizer};
use anyhow::{bail, Context};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::commands::device::DeviceArg;

/// Arguments of `agentrl generate`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "chat"])))]
pub struct GenerateArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json,
    /// tokenizer_config.json with the chat template), or a GGUF file
    /// (tokenizer and chat template from its metadata, tensors dequantised
    /// to f32 on load).
    #[arg(long)]
    model: PathBuf,
    /// One user message (rendered with the chat template).
    #[arg(long)]
    prompt: Option<String>,
    /// System message to put before `--prompt`.
    #[arg(long, requires = "prompt")]
    system: Option<String>,
    /// JSON file with the chat: `[{"role": …, "content": …}, …]` or
    /// `{"messages": [...]}`.
    #[arg(long)]
    chat: Option<PathBuf>,
    /// Most tokens to generate (the end-of-turn token counts).
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Nucleus sampling threshold; 1 disables it.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Keep only the K most likely tokens; 0 disables it.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print `{"prompt_ids": [...], "new_ids": [...], "text": "...", "stopped": bool}`.
    #[arg(long)]
    json: bool,
    /// Also write the logits of every prompt position to this JSON file,
    /// `{"ids": [...], "logits": [[...], ...]}` (`[T, vocab]`, f32), to
    /// compare with another implementation (scripts/peft_check.py).
    #[arg(long)]
    logits: Option<PathBuf>,
    /// Where the model runs (`cuda`: GPU 0, a build with the `cuda` feature).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// The precision of the sampler's large products on the CPU: `f32`, or
    /// `bf16` (AVX512-BF16; see `model.precision`). `--logits` is f32 either way.
    #[arg(long, value_name = "f32|bf16", default_value = "f32")]
    precision: Precision,
}

/// Reads the chat messages of `--chat`.
fn read_chat(path: &Path) -> anyhow::Result<Vec<ChatMessage>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading chat messages from {}", path.display()))?;
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum ChatFile {
        List(Vec<ChatMessage>),
        Object { messages: Vec<ChatMessage> },
    }
    let chat: ChatFile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON list of {{\"role\", \"content\"}} messages (or {{\"messages\": [...]}})",
            path.display()
        )
    })?;
    let messages = match chat {
        ChatFile::List(m) | ChatFile::Object { messages: m } => m,
    };
    if messages.is_empty() {
        bail!("{}: the chat has no messages", path.display());
    }
    Ok(messages)
}

/// Runs `agentrl generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if !args.model.is_dir() && !args.model.is_file() {
        bail!(
            "{} is neither a model directory nor a GGUF file",
            args.model.display()
        );
    }
    let messages = match (&args.prompt, &args.chat) {
        (Some(prompt), _) => {
            let mut m = Vec::new();
            if let Some(system) = &args.system {
                m.push(ChatMessage::system(system.clone()));
            }
            m.push(ChatMessage::user(prompt.clone()));
            m
        }
        (None, Some(path)) => read_chat(path)?,
        (None, None) => bail!("give --prompt TEXT or --chat MESSAGES.json"),
    };

    let tokenizer = ChatTokenizer::load(&args.model)
        .with_context(|| format!("loading the tokenizer of {}", args.model.display()))?;
    let prompt_ids = tokenizer
        .encode_chat(&messages, true)
        .context("rendering the chat template")?;
    let mut model = PolicyModel::load(&args.model, false, &args.device.open()?)
        .with_context(|| format!("loading the model in {}", args.model.display()))?;
    model.set_precision(args.precision)?;

    if let Some(path) = &args.logits {
        write_prompt_logits(&model, &prompt_ids, path)?;
    }

    let params = SamplingParams {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        stop_tokens: tokenizer.stop_ids(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let generation = model
        .generate(std::slice::from_ref(&prompt_ids), &params, &mut rng)
        .context("generating")?
        .into_iter()
        .next()
        .context("the model returned no generation")?;
    let text = tokenizer
        .decode(&generation.tokens, true)
        .context("decoding the generated tokens")?;

    if args.json {
        let out = serde_json::json!({
            "prompt_ids": prompt_ids,
            "new_ids": generation.tokens,
            "text": text,
            "stopped": generation.stopped,
        });
        println!("{out}");
    } else {
        println!("{text}");
    }
    Ok(())
}

/// Writes `{"ids", "logits"}` of the prompt (no autograd graph).
fn write_prompt_logits(model: &PolicyModel, ids: &[u32], path: &Path) -> anyhow::Result<()> {
    let input = candle_core::Tensor::new(ids, &model.device)?.unsqueeze(0)?;
    let logits: Vec<Vec<f32>> = model
        .forward_no_grad(&input)
        .context("computing the prompt's logits")?
        .squeeze(0)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec2()?;
    let out = serde_json::json!({ "ids": ids, "logits": logits });
    std::fs::write(path, out.to_string())
        .with_context(|| format!("writing the logits to {}", path.display()))
}
