//! `agentrl bench model`: train and sampling throughput of the candle policy
//! on the reference shape, beside PyTorch's figures for the same shape.

use std::time::Instant;

use agentrl_model::candle_core::{self, Device};
use agentrl_model::{clip_grad_norm, AdamW, AdamWConfig, ModelConfig, PolicyModel, SamplingParams};
use anyhow::Context;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Reference PyTorch figures from issue 3 (same shape, same machine class).
const TORCH_TRAIN_TOK_S: f64 = 7_900.0;
const TORCH_SAMPLE_TOK_S: f64 = 2_600.0;

#[derive(clap::Args)]
pub struct BenchModelArgs {
    /// Timed training steps (fwd + bwd + clip + AdamW), after one warm-up step.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Timed sampling runs, after one warm-up run.
    #[arg(long, default_value_t = 2)]
    sample_runs: usize,
    /// Training batch: sequences × tokens.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Training sequence length.
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    /// Sampling: prompt length (tokens) for each of `batch` prompts.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Sampling: new tokens per prompt.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The benchmark shape: vocab 512, d 256, 4 layers, 4 heads / 2 kv heads, ffn 688.
fn bench_config() -> ModelConfig {
    let mut c = ModelConfig::new_qwen2(512, 256, 4, 4, 2, 688);
    c.max_position_embeddings = 1024;
    c
}

fn random_seqs(rng: &mut ChaCha8Rng, n: usize, len: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(0..vocab)).collect())
        .collect()
}

pub fn run(args: BenchModelArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.steps > 0 && args.sample_runs > 0,
        "--steps and --sample-runs must be positive"
    );
    anyhow::ensure!(args.seq_len >= 2, "--seq-len must be at least 2");
    let dev = Device::Cpu;
    let cfg = bench_config();
    let model = PolicyModel::new_random(&cfg, false, 0, &dev).context("building the model")?;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let vocab = cfg.vocab_size as u32;

    // Training: -mean log-prob over a batch of random sequences.
    let vars = model.trainable_vars()?;
    let mut opt = AdamW::new(vars.clone(), AdamWConfig::default())?;
    let batch = random_seqs(&mut rng, args.batch, args.seq_len, vocab);
    let mut train_step = || -> anyhow::Result<()> {
        let out = model.sequence_logprobs(&batch)?;
        let loss = (&out.logprobs * &out.mask)?
            .sum_all()?
            .neg()?
            .affine(1.0 / out.mask.sum_all()?.to_scalar::<f32>()? as f64, 0.0)?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, &vars, 1.0)?;
        opt.step(&grads)?;
        Ok(())
    };
    train_step()?;
    let t0 = Instant::now();
    for _ in 0..args.steps {
        train_step()?;
    }
    let train_s = t0.elapsed().as_secs_f64() / args.steps as f64;
    let train_tok_s = (args.batch * args.seq_len) as f64 / train_s;

    // Sampling: temperature-1 sampling with the KV cache, no stop tokens.
    let prompts = random_seqs(&mut rng, args.batch, args.prompt_len, vocab);
    let params = SamplingParams {
        max_new_tokens: args.new_tokens,
        ..SamplingParams::default()
    };
    model.generate(&prompts, &params, &mut rng)?;
    let t0 = Instant::now();
    let mut new_tokens = 0usize;
    for _ in 0..args.sample_runs {
        new_tokens += model
            .generate(&prompts, &params, &mut rng)?
            .iter()
            .map(|g| g.tokens.len())
            .sum::<usize>();
    }
    let sample_s = t0.elapsed().as_secs_f64();
    let sample_tok_s = new_tokens as f64 / sample_s;

    let threads = candle_core::utils::get_num_threads();
    let parameters = model.num_parameters()?;
    // Figures on a shared machine depend on what else runs: print the load.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string());
    if args.json {
        let v = serde_json::json!({
            "shape": {"vocab": cfg.vocab_size, "d": cfg.hidden_size, "layers": cfg.num_hidden_layers,
                      "heads": cfg.num_attention_heads, "kv_heads": cfg.num_kv_heads(), "ffn": cfg.intermediate_size},
            "parameters": parameters,
            "threads": threads,
            "load_average_1m": load,
            "train_tokens_per_s": train_tok_s,
            "train_step_s": train_s,
            "sample_new_tokens_per_s": sample_tok_s,
            "reference_torch_train_tokens_per_s": TORCH_TRAIN_TOK_S,
            "reference_torch_sample_tokens_per_s": TORCH_SAMPLE_TOK_S,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "model: vocab {} d {} layers {} heads {}/{} kv ffn {} ({} parameters), f32 CPU, {} matmul threads, load average {}",
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_kv_heads(),
        cfg.intermediate_size,
        parameters,
        threads,
        load
    );
    println!(
        "train    {:>9.0} tok/s  (batch {}x{}, fwd+bwd+clip+AdamW, {:.3} s/step)  vs reference PyTorch figure from the issue {:.0} tok/s: {:.2}x",
        train_tok_s, args.batch, args.seq_len, train_s, TORCH_TRAIN_TOK_S, train_tok_s / TORCH_TRAIN_TOK_S
    );
    println!(
        "sampling {:>9.0} tok/s  ({} prompts x {} tokens, {} new, KV cache, T=1)  vs reference PyTorch figure from the issue {:.0} tok/s: {:.2}x",
        sample_tok_s, args.batch, args.prompt_len, args.new_tokens, TORCH_SAMPLE_TOK_S, sample_tok_s / TORCH_SAMPLE_TOK_S
    );
    Ok(())
}
