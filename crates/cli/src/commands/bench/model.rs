//! `agentrl bench model`: train and sampling throughput of the candle policy,
//! its model-FLOPs utilisation, and — when a Python with torch and
//! transformers is at hand — the same workload on Hugging Face's
//! Qwen2ForCausalLM in the same invocation (`bench/torch_model.py`), with
//! the ratios. On the CPU by default; `--device cuda` (a build with the
//! `cuda` feature) runs both sides on GPU 0.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use agentrl_model::candle_core::{self, DType, Device, Tensor};
use agentrl_model::{
    clip_grad_norm, AdamW, AdamWConfig, ModelConfig, PolicyModel, ProfiledRange, SamplingParams,
};
use anyhow::{bail, Context};

use crate::commands::device::DeviceArg;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The PyTorch side, fed to the interpreter on stdin so the binary needs no
/// source tree at run time.
const TORCH_SCRIPT: &str = include_str!("../../../../../bench/torch_model.py");

/// The benchmark shapes (the PyTorch script has the same table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// vocab 512, d 256, 4 layers, 4/2 heads, ffn 688 (≈ 3.0M parameters).
    Small,
    /// vocab 512, d 512, 8 layers, 8/2 heads, ffn 1376 (≈ 22.4M parameters, tied embeddings).
    Medium,
    /// Qwen2.5-0.5B's shape: vocab 151936, d 896, 24 layers, 14/2 heads,
    /// ffn 4864, rope θ 1e6, tied embeddings (≈ 494M parameters), random weights.
    #[value(name = "qwen2.5-0.5b")]
    Qwen25Half,
}

/// The weights' dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchDtype {
    /// 32-bit floats (full-precision GEMMs on both sides: no TF32).
    F32,
    /// bfloat16. On a GPU the weights are bf16; on the CPU (AVX512-BF16)
    /// the weights stay f32 and the large products round their inputs to
    /// bf16 with f32 sums, against PyTorch's bf16 autocast.
    Bf16,
}

impl BenchDtype {
    fn candle(self) -> candle_core::DType {
        match self {
            BenchDtype::F32 => candle_core::DType::F32,
            BenchDtype::Bf16 => candle_core::DType::BF16,
        }
    }

    /// The name PyTorch's script takes.
    fn torch(self) -> &'static str {
        match self {
            BenchDtype::F32 => "float32",
            BenchDtype::Bf16 => "bfloat16",
        }
    }
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Small => "small",
            Shape::Medium => "medium",
            Shape::Qwen25Half => "qwen2.5-0.5b",
        }
    }

    fn config(self) -> ModelConfig {
        let mut c = match self {
            Shape::Small => ModelConfig::new_qwen2(512, 256, 4, 4, 2, 688),
            Shape::Medium => ModelConfig::new_qwen2(512, 512, 8, 8, 2, 1376),
            Shape::Qwen25Half => {
                let mut c = ModelConfig::new_qwen2(151_936, 896, 24, 14, 2, 4864);
                c.rope_theta = Some(1_000_000.0);
                if let Some(p) = c.rope_parameters.as_mut() {
                    p.rope_theta = Some(1_000_000.0);
                }
                c
            }
        };
        c.max_position_embeddings = 1024;
        c
    }
}

#[derive(clap::Args)]
pub struct BenchModelArgs {
    /// Model shape (random weights).
    #[arg(long, value_enum, default_value_t = Shape::Small)]
    shape: Shape,
    /// A checkpoint instead of a random shape: a Hugging Face directory or
    /// a `.gguf` file (PyTorch loads the same weights: transformers'
    /// `from_pretrained`, with `gguf_file=` for a GGUF).
    #[arg(long, value_name = "DIR|FILE.gguf", conflicts_with = "shape")]
    model: Option<std::path::PathBuf>,
    /// Where both sides run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// The weights' dtype on both sides.
    #[arg(long, value_enum, default_value_t = BenchDtype::F32)]
    dtype: BenchDtype,
    /// Timed training steps (fwd + bwd + clip + AdamW), after one warm-up step.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Timed sampling runs, after one warm-up run.
    #[arg(long, default_value_t = 2)]
    sample_runs: usize,
    /// Rounds of both measurements, alternating agentrl and PyTorch; the
    /// figures are each side's median and the ratio the median of the
    /// rounds' ratios (a shared host's load moves both sides' figures by
    /// 10–20% from one minute to the next).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Training batch: sequences × tokens.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Training sequence length.
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    /// Training as an RL update reads it: the loss on each sequence's last
    /// `reply_len` tokens only (0: on every token, a language-model step).
    #[arg(long, default_value_t = 0)]
    reply_len: usize,
    /// With `--reply-len`: sequences come in groups of this many that share
    /// their prompt (a GRPO group; agentrl packs a shared prompt once).
    #[arg(long, default_value_t = 1)]
    group: usize,
    /// Sampling: prompt length (tokens) for each of `batch` prompts.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Sampling: new tokens per prompt.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Python interpreter with torch and transformers for the reference run
    /// (default: `python3` on PATH, if it imports both).
    #[arg(long, value_name = "PATH")]
    python: Option<String>,
    /// Skip the PyTorch reference run.
    #[arg(long, conflicts_with = "python")]
    no_torch: bool,
    /// Train a LoRA adapter of rank R on every projection (lora_alpha 2R)
    /// instead of every weight: a step without the weights' gradient
    /// products. No PyTorch reference (it would need PEFT).
    #[arg(long, value_name = "R")]
    lora: Option<usize>,
    /// Train through candle's composite graph, the one a GPU step runs,
    /// instead of the CPU's fused decoder layers: on the CPU, a measure of
    /// what the GPU's graph costs around its kernels.
    #[arg(long)]
    composite: bool,
    /// Attention on a GPU: `flash` (one fused op, where its bf16 kernels
    /// apply) or `materialized` (scores, causal softmax, product). The CPU
    /// always materialises.
    #[arg(long, value_enum, default_value_t = AttentionPath::Flash)]
    attention: AttentionPath,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// How the GPU computes attention (`--attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AttentionPath {
    Flash,
    Materialized,
}

/// FLOPs the model needs, counted as PaLM's MFU does: 2 per multiply-add of
/// every weight matrix (the LM head included, biases and norms not) per
/// token, plus attention's q·k and p·v over the whole context.
#[derive(Debug, Clone, Copy)]
struct FlopModel {
    /// Weight-matrix parameters touched per token.
    matmul_params: f64,
    /// layers × query heads × head width.
    attn_width: f64,
}

impl FlopModel {
    fn of(cfg: &ModelConfig) -> Self {
        let d = cfg.hidden_size as f64;
        let q = (cfg.num_attention_heads * cfg.head_dim()) as f64;
        let kv = (cfg.num_kv_heads() * cfg.head_dim()) as f64;
        let f = cfg.intermediate_size as f64;
        let layer = d * q + 2.0 * d * kv + q * d + 3.0 * d * f;
        Self {
            matmul_params: cfg.num_hidden_layers as f64 * layer + cfg.vocab_size as f64 * d,
            attn_width: (cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim()) as f64,
        }
    }

    /// Forward FLOPs of one token that attends over `context` keys.
    fn forward_token(&self, context: f64) -> f64 {
        2.0 * self.matmul_params + 4.0 * self.attn_width * context
    }

    /// Forward + backward FLOPs of one trained token in sequences of `t`
    /// (backward = 2 × forward; the whole T×T counted, as PaLM does). With
    /// `frozen` weights (LoRA) the backward of a weight matrix is its
    /// input's gradient only (the adapters' rank-sized products not counted).
    fn train_token(&self, t: f64, frozen: bool) -> f64 {
        let weights = if frozen { 2.0 } else { 3.0 };
        weights * 2.0 * self.matmul_params + 3.0 * 4.0 * self.attn_width * t
    }

    /// FLOPs of one sampling run: the prompts' prefill (causal, so a prompt
    /// token sees half the prompt on average) and each new token over its context.
    fn sample_run(&self, prompts: f64, prompt_len: f64, new: usize) -> f64 {
        let prefill = prompts * prompt_len * self.forward_token(prompt_len / 2.0);
        let decode: f64 = (0..new)
            .map(|i| prompts * self.forward_token(prompt_len + i as f64 + 1.0))
            .sum();
        prefill + decode
    }
}

/// The machine's f32 peak as this process sees it: every thread runs
/// independent fused multiply-add chains (no memory traffic) for a moment;
/// the sum of their rates is the MFU denominator.
mod peak {
    use std::time::Instant;

    /// FLOP/s of `threads` threads each running FMA chains for about `seconds`
    /// (the sum of each thread's best window).
    pub fn fma_flops(threads: usize, seconds: f64) -> f64 {
        let per_thread: Vec<f64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads.max(1))
                .map(|_| s.spawn(move || one_thread(seconds)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0.0))
                .collect()
        });
        per_thread.iter().sum()
    }

    /// The best rate of ~20 ms windows over `seconds`: on a shared machine
    /// the best window is the closest to the core's own speed.
    fn one_thread(seconds: f64) -> f64 {
        let (flops_per_round, mut round) = kernel();
        round(); // clock ramp
        let start = Instant::now();
        let mut best = 0f64;
        while start.elapsed().as_secs_f64() < seconds {
            let t0 = Instant::now();
            let mut rounds = 0u64;
            while t0.elapsed().as_secs_f64() < 0.02 {
                round();
                rounds += 1;
            }
            best = best.max(rounds as f64 * flops_per_round / t0.elapsed().as_secs_f64());
        }
        best
    }

    const ITERS: usize = 2_000;
    const CHAINS: usize = 12;

    /// The widest FMA loop the CPU runs, as (FLOPs per call, the call).
    #[cfg(target_arch = "x86_64")]
    fn kernel() -> (f64, Box<dyn FnMut()>) {
        if std::arch::is_x86_feature_detected!("avx512f") {
            let flops = (ITERS * CHAINS * 16 * 2) as f64;
            // SAFETY: avx512f was detected at run time just above.
            return (flops, Box::new(|| unsafe { sink(fma512(ITERS)) }));
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            let flops = (ITERS * CHAINS * 8 * 2) as f64;
            // SAFETY: avx2 and fma were detected at run time just above.
            return (flops, Box::new(|| unsafe { sink(fma256(ITERS)) }));
        }
        portable()
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn kernel() -> (f64, Box<dyn FnMut()>) {
        portable()
    }

    /// Scalar chains the compiler may vectorise: a lower bound on other CPUs.
    fn portable() -> (f64, Box<dyn FnMut()>) {
        let flops = (ITERS * CHAINS * 8 * 2) as f64;
        (
            flops,
            Box::new(|| {
                let mut acc = [[0f32; 8]; CHAINS];
                for _ in 0..ITERS {
                    for chain in acc.iter_mut() {
                        for x in chain.iter_mut() {
                            *x = x.mul_add(0.999_999, 1e-7);
                        }
                    }
                }
                sink(acc.iter().flatten().sum());
            }),
        )
    }

    fn sink(x: f32) {
        std::hint::black_box(x);
    }

    /// `unsafe fn NAME(iters) -> f32`: `iters` rounds of `CHAINS`
    /// independent FMA chains in one register type (made by `set1` and
    /// `zero`, chained by `fma`, added by `add`), the chains' sum `total`
    /// reduced to one number by `sum`.
    macro_rules! fma_chains {
        (
            $(#[$attr:meta])*
            fn $name:ident($set1:ident, $zero:ident, $fma:ident, $add:ident),
            |$total:ident| $sum:expr
        ) => {
            #[cfg(target_arch = "x86_64")]
            $(#[$attr])*
            unsafe fn $name(iters: usize) -> f32 {
                use std::arch::x86_64::*;
                let a = $set1(0.999_999);
                let b = $set1(1e-7);
                let mut acc = [$zero(); CHAINS];
                for _ in 0..iters {
                    for x in acc.iter_mut() {
                        *x = $fma(*x, a, b);
                    }
                }
                let $total = acc.iter().fold($zero(), |s, x| $add(s, *x));
                $sum
            }
        };
    }

    fma_chains!(
        #[target_feature(enable = "avx2,fma")]
        fn fma256(_mm256_set1_ps, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_add_ps),
        |total| {
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), total);
            out.iter().sum()
        }
    );

    fma_chains!(
        #[target_feature(enable = "avx512f")]
        fn fma512(_mm512_set1_ps, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_add_ps),
        |total| _mm512_reduce_add_ps(total)
    );
}

/// FLOP/s of candle's f32 matmul on an `n`×`n`×`n` product (what a large,
/// well-shaped GEMM reaches here; printed beside the FMA peak).
fn large_matmul_flops(n: usize, dtype: DType, dev: &Device) -> anyhow::Result<f64> {
    // Random (not constant) operands: a GPU's clock and power depend on the data.
    let a = Tensor::randn(0f32, 1.0, (n, n), dev)?.to_dtype(dtype)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), dev)?.to_dtype(dtype)?;
    let reps = if dev.is_cpu() { 3 } else { 20 };
    a.matmul(&b)?;
    dev.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..reps {
        a.matmul(&b)?;
    }
    dev.synchronize()?;
    Ok(reps as f64 * 2.0 * (n * n * n) as f64 / t0.elapsed().as_secs_f64())
}

/// The training batch: random sequences, in groups of `--group` that share
/// all but their last `--reply-len` tokens when a reply length is given.
fn train_batch(rng: &mut ChaCha8Rng, args: &BenchModelArgs, vocab: u32) -> Vec<Vec<u32>> {
    let mut seqs = random_seqs(rng, args.batch, args.seq_len, vocab);
    if args.reply_len > 0 {
        let prompt = args.seq_len - args.reply_len;
        for g in seqs.chunks_mut(args.group.max(1)) {
            let shared = g[0][..prompt].to_vec();
            for s in g.iter_mut() {
                s[..prompt].copy_from_slice(&shared);
            }
        }
    }
    seqs
}

fn random_seqs(rng: &mut ChaCha8Rng, n: usize, len: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(0..vocab)).collect())
        .collect()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// The candle side's figures.
#[derive(Debug, Clone, Copy)]
struct Measured {
    train_step_s: f64,
    /// One extra step, synchronised after each phase: forward (with the
    /// loss), backward, gradient clipping, AdamW, in seconds.
    train_phases_s: [f64; 4],
    train_tok_s: f64,
    sample_s: f64,
    sample_tok_s: f64,
}

impl Measured {
    /// The round with the median training throughput, its sampling figures
    /// replaced by those of the round with the median sampling throughput.
    fn median_round(rounds: &[Measured]) -> Measured {
        let middle = |key: fn(&Measured) -> f64| {
            let mut sorted: Vec<&Measured> = rounds.iter().collect();
            sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
            *sorted[sorted.len() / 2]
        };
        let sampling = middle(|m| m.sample_tok_s);
        Measured {
            sample_s: sampling.sample_s,
            sample_tok_s: sampling.sample_tok_s,
            ..middle(|m| m.train_tok_s)
        }
    }
}

/// The median of `v` (the upper of the middle two for an even count);
/// `None` when `v` is empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn measure_agentrl(args: &BenchModelArgs, model: &PolicyModel) -> anyhow::Result<Measured> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let vocab = model.config.vocab_size as u32;
    // Training: minus the mean log-prob over a batch of random sequences
    // (PyTorch: the cross-entropy of `labels=input_ids`, the same number).
    let vars = model.trainable_vars()?;
    let mut opt = AdamW::new(vars.clone(), AdamWConfig::default())?;
    let batch = train_batch(&mut rng, args, vocab);
    // The loss's positions (shifted frame): the replies, or everything.
    let scored: Option<Vec<Vec<f32>>> = (args.reply_len > 0).then(|| {
        let first = args.seq_len - args.reply_len - 1;
        let row: Vec<f32> = (0..args.seq_len - 1)
            .map(|t| f32::from(u8::from(t >= first)))
            .collect();
        vec![row; args.batch]
    });
    // `phases`: synchronise and record the clock after each phase.
    let mut train_step = |mut phases: Option<&mut [f64; 4]>| -> anyhow::Result<()> {
        let mut t = Instant::now();
        let mut mark = |i: usize| -> anyhow::Result<()> {
            if let Some(p) = phases.as_deref_mut() {
                model.device.synchronize()?;
                p[i] = t.elapsed().as_secs_f64();
                t = Instant::now();
            }
            Ok(())
        };
        let (out, mask) = match &scored {
            Some(rows) => {
                let out = model.scored_logprobs(&batch, rows)?;
                let mask = Tensor::new(rows.clone(), &model.device)?.to_dtype(out.mask.dtype())?;
                (out, mask)
            }
            None => {
                let out = model.sequence_logprobs(&batch)?;
                let mask = out.mask.clone();
                (out, mask)
            }
        };
        let n = mask.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? as f64;
        let loss = (&out.logprobs * &mask)?.sum_all()?.affine(-1.0 / n, 0.0)?;
        mark(0)?;
        let mut grads = loss.backward()?;
        mark(1)?;
        clip_grad_norm(&mut grads, &vars, 1.0)?;
        mark(2)?;
        opt.step(&grads)?;
        mark(3)?;
        // A GPU runs the step asynchronously: the clock stops when it is done.
        model.device.synchronize()?;
        Ok(())
    };
    train_step(None)?;
    // The timed steps are one profiled range (bench/kernel-profile), the
    // timed sampling runs the next.
    let profiled = ProfiledRange::start(&model.device)?;
    let t0 = Instant::now();
    for _ in 0..args.steps {
        train_step(None)?;
    }
    let train_step_s = t0.elapsed().as_secs_f64() / args.steps as f64;
    profiled.end()?;
    let mut train_phases_s = [0.0; 4];
    train_step(Some(&mut train_phases_s))?;

    // Sampling: temperature 1, no truncation, no stop token: every run makes
    // batch × new_tokens tokens.
    let prompts = random_seqs(&mut rng, args.batch, args.prompt_len, vocab);
    let params = SamplingParams {
        max_new_tokens: args.new_tokens,
        ..SamplingParams::default()
    };
    model.generate(&prompts, &params, &mut rng)?;
    let profiled = ProfiledRange::start(&model.device)?;
    let t0 = Instant::now();
    let mut new_tokens = 0usize;
    for _ in 0..args.sample_runs {
        new_tokens += model
            .generate(&prompts, &params, &mut rng)?
            .iter()
            .map(|g| g.tokens.len())
            .sum::<usize>();
    }
    let sample_s = t0.elapsed().as_secs_f64() / args.sample_runs as f64;
    profiled.end()?;
    Ok(Measured {
        train_step_s,
        train_phases_s,
        train_tok_s: (args.batch * args.seq_len) as f64 / train_step_s,
        sample_s,
        sample_tok_s: new_tokens as f64 / (sample_s * args.sample_runs as f64),
    })
}

/// The PyTorch reference's figures.
struct TorchMeasured {
    version: String,
    train_tok_s: f64,
    sample_tok_s: f64,
}

impl TorchMeasured {
    /// Each figure's median over the rounds; `None` when there were none.
    fn median(rounds: &[TorchMeasured]) -> Option<TorchMeasured> {
        let first = rounds.first()?;
        Some(TorchMeasured {
            version: first.version.clone(),
            train_tok_s: median(rounds.iter().map(|t| t.train_tok_s).collect())?,
            sample_tok_s: median(rounds.iter().map(|t| t.sample_tok_s).collect())?,
        })
    }
}

/// Which interpreter runs the reference: `--python`, else `python3` when it
/// imports torch and transformers; `None` when there is none.
fn torch_python(args: &BenchModelArgs) -> Option<String> {
    if args.no_torch || args.lora.is_some() {
        return None;
    }
    if let Some(p) = &args.python {
        return Some(p.clone());
    }
    let ok = Command::new("python3")
        .args(["-c", "import torch, transformers"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then(|| "python3".to_string())
}

fn measure_torch(
    python: &str,
    args: &BenchModelArgs,
    threads: usize,
) -> anyhow::Result<TorchMeasured> {
    let on_gpu = args.device == DeviceArg::Cuda;
    let mut flags = vec![
        ("--shape", args.shape.name().to_string()),
        ("--threads", threads.to_string()),
        ("--device", args.device.name().to_string()),
        // On the CPU bf16 is autocast over f32 weights, as agentrl's.
        (
            "--dtype",
            if on_gpu {
                args.dtype.torch()
            } else {
                "float32"
            }
            .to_string(),
        ),
        ("--batch", args.batch.to_string()),
        ("--seq-len", args.seq_len.to_string()),
        ("--prompt-len", args.prompt_len.to_string()),
        ("--new-tokens", args.new_tokens.to_string()),
        ("--steps", args.steps.to_string()),
        ("--sample-runs", args.sample_runs.to_string()),
        ("--reply-len", args.reply_len.to_string()),
        ("--group", args.group.to_string()),
    ];
    if let Some(m) = &args.model {
        flags.push(("--model", m.display().to_string()));
    }
    if !on_gpu && args.dtype == BenchDtype::Bf16 {
        flags.push(("--autocast", "bfloat16".to_string()));
    }
    let script_args: Vec<String> = flags
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
    let mut child = Command::new(python)
        .arg("-")
        .args(&script_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting `{python}` for the PyTorch reference"))?;
    child
        .stdin
        .take()
        .context("no stdin for the PyTorch reference")?
        .write_all(TORCH_SCRIPT.as_bytes())
        .context("writing bench/torch_model.py to the interpreter")?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "the PyTorch reference (`{python} bench/torch_model.py`) failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("the PyTorch reference printed no JSON line")?;
    let v: serde_json::Value =
        serde_json::from_str(line).context("parsing the PyTorch reference's JSON")?;
    let num = |k: &str| -> anyhow::Result<f64> {
        v[k].as_f64()
            .with_context(|| format!("the PyTorch reference's JSON has no number `{k}`"))
    };
    Ok(TorchMeasured {
        version: format!(
            "torch {} / transformers {}",
            v["torch_version"].as_str().unwrap_or("?"),
            v["transformers_version"].as_str().unwrap_or("?")
        ),
        train_tok_s: num("train_tokens_per_s")?,
        sample_tok_s: num("sample_tokens_per_s")?,
    })
}

pub fn run(args: BenchModelArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.steps > 0 && args.sample_runs > 0 && args.batch > 0 && args.rounds > 0,
        "--steps, --sample-runs, --batch and --rounds must be positive"
    );
    anyhow::ensure!(args.seq_len >= 2, "--seq-len must be at least 2");
    anyhow::ensure!(
        args.reply_len < args.seq_len && args.group > 0,
        "--reply-len must be shorter than --seq-len, and --group positive"
    );
    anyhow::ensure!(
        args.prompt_len > 0 && args.new_tokens > 0,
        "--prompt-len and --new-tokens must be positive"
    );
    let dev = args.device.open()?;
    let on_gpu = args.device == DeviceArg::Cuda;
    // On the CPU bf16 is the products' precision; the weights stay f32.
    let dtype = if on_gpu {
        args.dtype.candle()
    } else {
        DType::F32
    };
    let precision = match args.dtype {
        BenchDtype::Bf16 if !on_gpu => agentrl_model::Precision::Bf16,
        _ => agentrl_model::Precision::F32,
    };
    anyhow::ensure!(
        precision.available(),
        "--dtype bf16 on the CPU needs AVX512-BF16, which this CPU lacks"
    );
    // A checkpoint is loaded here for its configuration; the first round
    // measures it, later ones load it again.
    let mut loaded = match &args.model {
        Some(path) => Some(
            PolicyModel::load(path, false, &dev)
                .with_context(|| format!("loading {}", path.display()))?,
        ),
        None => None,
    };
    let cfg = match &loaded {
        Some(m) => m.config.clone(),
        None => args.shape.config(),
    };
    let name = match &args.model {
        Some(p) => p.display().to_string(),
        None => args.shape.name().to_string(),
    };
    // Whether the training and prefill attention runs the flash kernels.
    let flash_ran = args.attention == AttentionPath::Flash
        && agentrl_model::flash_attention::flash_attention_applies(dtype, &dev, cfg.head_dim());
    anyhow::ensure!(
        args.seq_len <= cfg.max_position_embeddings
            && args.prompt_len + args.new_tokens <= cfg.max_position_embeddings,
        "sequences must fit {} positions",
        cfg.max_position_embeddings
    );
    anyhow::ensure!(
        args.model.is_none() || !on_gpu || args.dtype == BenchDtype::F32,
        "--model on a GPU runs in f32 (the checkpoint's weights as loaded)"
    );
    let threads = candle_core::utils::get_num_threads();
    let load_start = load_average();
    // The MFU denominator: on the CPU the FMA peak of candle's threads; on a
    // GPU the rate of a large square GEMM in the benchmark's dtype (what
    // cuBLAS reaches on this card, not the datasheet's figure).
    let peak_now = || -> anyhow::Result<f64> {
        if on_gpu {
            large_matmul_flops(8192, dtype, &dev)
        } else {
            // vdpbf16ps does twice the multiply-adds of an f32 FMA.
            let per_fma = if precision == agentrl_model::Precision::Bf16 {
                2.0
            } else {
                1.0
            };
            Ok(per_fma * peak::fma_flops(threads, 0.5))
        }
    };
    // On a GPU the start's peak is the large GEMM printed beside it.
    let (peak_start, gemm) = if on_gpu {
        let g = peak_now()?;
        (g, g)
    } else {
        (peak_now()?, large_matmul_flops(1024, dtype, &dev)?)
    };
    let python = torch_python(&args);
    let mut rounds = Vec::with_capacity(args.rounds);
    let mut torch_rounds = Vec::with_capacity(args.rounds);
    let mut parameters = 0;
    for _ in 0..args.rounds {
        // Built anew each round (the same seed, the same weights): the
        // PyTorch side needs the GPU's memory next.
        let model = match (loaded.take(), &args.model) {
            (Some(m), _) => m,
            (None, Some(path)) => PolicyModel::load(path, false, &dev)
                .with_context(|| format!("loading {}", path.display()))?,
            (None, None) => PolicyModel::new_random_with_dtype(&cfg, false, 0, dtype, &dev)
                .context("building the model")?,
        };
        let mut model = model;
        model.set_precision(precision)?;
        model.set_fused_training(!args.composite);
        model.set_flash_attention(args.attention == AttentionPath::Flash);
        if let Some(r) = args.lora {
            let lora = agentrl_model::LoraConfig {
                r,
                alpha: 2.0 * r as f64,
                dropout: 0.0,
                target_modules: agentrl_model::LoraTarget::ALL.to_vec(),
                use_rslora: false,
            };
            model.attach_lora(lora, 0)?;
        }
        parameters = model.num_parameters()?;
        rounds.push(measure_agentrl(&args, &model)?);
        drop(model);
        if let Some(p) = &python {
            torch_rounds.push(measure_torch(p, &args, threads)?);
        }
    }
    let ours = Measured::median_round(&rounds);
    let torch = TorchMeasured::median(&torch_rounds);
    let ratios = |ours_of: fn(&Measured) -> f64, theirs_of: fn(&TorchMeasured) -> f64| {
        median(
            rounds
                .iter()
                .zip(&torch_rounds)
                .map(|(o, t)| ours_of(o) / theirs_of(t))
                .collect(),
        )
    };
    let train_ratio = ratios(|m| m.train_tok_s, |t| t.train_tok_s);
    let sample_ratio = ratios(|m| m.sample_tok_s, |t| t.sample_tok_s);
    let load_end = load_average();
    // Measured again at the end; the better of the two is the peak.
    let peak = peak_start.max(peak_now()?);

    let flops = FlopModel::of(&cfg);
    // MFU counts the tokens each side computes: agentrl packs a group's
    // shared prompt once, PyTorch runs every sequence whole.
    let computed = if args.reply_len > 0 {
        let groups = args.batch.div_ceil(args.group);
        groups * (args.seq_len - args.reply_len) + args.batch * args.reply_len
    } else {
        args.batch * args.seq_len
    };
    let train_flop_s = computed as f64 / ours.train_step_s
        * flops.train_token(args.seq_len as f64, args.lora.is_some());
    let mfu = train_flop_s / peak;
    let sample_flops = flops.sample_run(args.batch as f64, args.prompt_len as f64, args.new_tokens);
    let sample_mfu = sample_flops / ours.sample_s / peak;
    let torch_mfu = torch.as_ref().map(|t| {
        t.train_tok_s * flops.train_token(args.seq_len as f64, args.lora.is_some()) / peak
    });

    if args.json {
        let mut v = serde_json::json!({
            "shape": name,
            "reply_len": args.reply_len,
            "lora_rank": args.lora,
            "composite": args.composite,
            "flash_attention": flash_ran,
            "group": args.group,
            "config": {"vocab": cfg.vocab_size, "d": cfg.hidden_size, "layers": cfg.num_hidden_layers,
                       "heads": cfg.num_attention_heads, "kv_heads": cfg.num_kv_heads(), "ffn": cfg.intermediate_size},
            "parameters": parameters,
            "device": args.device.name(),
            "dtype": args.dtype.torch(),
            "threads": threads,
            "gemm_backend": agentrl_model::gemm_backend(),
            "load_average_1m_start": load_start,
            "load_average_1m_end": load_end,
            "peak_flops": peak,
            "large_matmul_flops": gemm,
            "train_tokens_per_s": ours.train_tok_s,
            "train_step_s": ours.train_step_s,
            "train_phases_s": {"forward": ours.train_phases_s[0], "backward": ours.train_phases_s[1],
                               "clip": ours.train_phases_s[2], "adamw": ours.train_phases_s[3]},
            "sample_tokens_per_s": ours.sample_tok_s,
            "mfu": mfu,
            "sample_mfu": sample_mfu,
            "rounds": args.rounds,
            "train_tokens_per_s_rounds": rounds.iter().map(|m| m.train_tok_s).collect::<Vec<_>>(),
        });
        if let Some(t) = &torch {
            v["torch_version"] = serde_json::json!(t.version);
            v["torch_train_tokens_per_s"] = serde_json::json!(t.train_tok_s);
            v["torch_sample_tokens_per_s"] = serde_json::json!(t.sample_tok_s);
            v["torch_mfu"] = serde_json::json!(torch_mfu);
            v["train_ratio"] = serde_json::json!(train_ratio);
            v["sample_ratio"] = serde_json::json!(sample_ratio);
            v["torch_train_tokens_per_s_rounds"] = serde_json::json!(torch_rounds
                .iter()
                .map(|t| t.train_tok_s)
                .collect::<Vec<_>>());
        }
        println!("{v}");
        return Ok(());
    }
    println!(
        "model {}: vocab {} d {} layers {} heads {}/{} kv ffn {} ({} parameters), {} {}",
        name,
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_kv_heads(),
        cfg.intermediate_size,
        parameters,
        args.dtype.torch(),
        if on_gpu {
            "CUDA device 0".to_string()
        } else {
            format!(
                "CPU, {threads} threads, GEMMs: {}",
                agentrl_model::gemm_backend()
            )
        },
    );
    if let Some(r) = args.lora {
        println!("training a LoRA adapter of rank {r} on every projection (the base frozen)");
    }
    if on_gpu {
        println!(
            "attention: {}",
            if flash_ran {
                "flash (kernels/flash_attention.cu)"
            } else {
                "materialised scores and causal softmax"
            }
        );
    }
    if args.composite && !on_gpu {
        println!("training through candle's composite graph (a GPU step's), not the fused layers");
    }
    println!("load average (1 min): {load_start} at the start, {load_end} at the end");
    if on_gpu {
        println!(
            "peak {:.1} TFLOP/s: an 8192³ {} matmul on this GPU, the better of start and end \
             (the MFU denominator)",
            peak / 1e12,
            args.dtype.torch()
        );
    } else {
        println!(
            "peak {:.1} GFLOP/s ({threads} threads of FMA chains, best 20 ms window at start and end; \
             the MFU denominator); a 1024³ f32 matmul reaches {:.1} GFLOP/s",
            peak / 1e9,
            gemm / 1e9
        );
    }
    let ratio = |r: Option<f64>| match r {
        Some(r) => format!("{r:>8.2}x"),
        None => format!("{:>9}", "-"),
    };
    let theirs = |f: fn(&TorchMeasured) -> f64| torch.as_ref().map(f);
    let cell = |x: Option<f64>| x.map_or_else(|| format!("{:>12}", "-"), |x| format!("{x:>12.0}"));
    println!("{:<34}{:>12}{:>12}{:>9}", "", "agentrl", "PyTorch", "ratio");
    println!(
        "{:<34}{:>12.0}{}{}",
        if args.reply_len > 0 {
            format!(
                "train tok/s ({}x{}, loss on {}, groups of {})",
                args.batch, args.seq_len, args.reply_len, args.group
            )
        } else {
            format!("train tok/s ({}x{}, +clip+AdamW)", args.batch, args.seq_len)
        },
        ours.train_tok_s,
        cell(theirs(|t| t.train_tok_s)),
        ratio(train_ratio)
    );
    println!(
        "{:<34}{:>12.0}{}{}",
        format!(
            "sample tok/s ({}x{}, {} new)",
            args.batch, args.prompt_len, args.new_tokens
        ),
        ours.sample_tok_s,
        cell(theirs(|t| t.sample_tok_s)),
        ratio(sample_ratio)
    );
    println!(
        "{:<34}{:>11.1}%{:>12}",
        "train MFU",
        100.0 * mfu,
        torch_mfu.map_or_else(|| "-".to_string(), |m| format!("{:.1}%", 100.0 * m))
    );
    println!(
        "{:<34}{:>11.1}%",
        "sampling MFU (prefill + decode)",
        100.0 * sample_mfu
    );
    if args.rounds > 1 {
        let list = |v: Vec<String>| v.join(" ");
        let ours_list = list(
            rounds
                .iter()
                .map(|m| format!("{:.0}", m.train_tok_s))
                .collect(),
        );
        let theirs_list = if torch_rounds.is_empty() {
            String::new()
        } else {
            let tok_s = torch_rounds.iter().map(|t| format!("{:.0}", t.train_tok_s));
            let ratios = rounds
                .iter()
                .zip(&torch_rounds)
                .map(|(o, t)| format!("{:.2}", o.train_tok_s / t.train_tok_s));
            format!(
                "; PyTorch {}; ratios {}",
                list(tok_s.collect()),
                list(ratios.collect())
            )
        };
        println!(
            "{} rounds, agentrl then PyTorch in each (medians above): train tok/s agentrl {ours_list}{theirs_list}",
            args.rounds
        );
    }
    let [fwd, bwd, clip, adamw] = ours.train_phases_s.map(|s| s * 1e3);
    println!(
        "agentrl train step {:.1} ms; one more, synchronised per phase: forward+loss {fwd:.1} ms, \
         backward {bwd:.1} ms, clip {clip:.1} ms, AdamW {adamw:.1} ms",
        ours.train_step_s * 1e3
    );
    match (&torch, &python) {
        (Some(t), Some(p)) => println!(
            "PyTorch reference: {} via `{p}` (bench/torch_model.py, same {}, {})",
            t.version,
            if on_gpu { "GPU" } else { "threads" },
            args.dtype.torch()
        ),
        _ => println!(
            "PyTorch reference: not measured ({}; pass --python PATH to a Python with torch and transformers)",
            if args.no_torch {
                "--no-torch"
            } else if args.lora.is_some() {
                "--lora: PyTorch would need PEFT"
            } else {
                "python3 does not import torch and transformers"
            }
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(train_tok_s: f64, sample_tok_s: f64) -> Measured {
        Measured {
            train_step_s: 1.0 / train_tok_s,
            train_phases_s: [train_tok_s; 4],
            train_tok_s,
            sample_s: 1.0 / sample_tok_s,
            sample_tok_s,
        }
    }

    #[test]
    fn median_takes_the_middle_or_the_upper_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn median_round_takes_training_and_sampling_each_from_its_median_round() {
        let m = Measured::median_round(&[round(10.0, 7.0), round(30.0, 5.0), round(20.0, 9.0)]);
        assert_eq!(m.train_tok_s, 20.0);
        assert_eq!(m.train_phases_s, [20.0; 4], "phases come with their round");
        assert_eq!(m.sample_tok_s, 7.0);
        assert_eq!(m.sample_s, 1.0 / 7.0);
    }
}
