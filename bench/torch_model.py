"""PyTorch + transformers side of `agentrl bench model`.

Runs the same workload as the Rust benchmark on Hugging Face's own
Qwen2ForCausalLM (built from a config, random weights; float32 on the CPU by
default, `--device cuda` and `--dtype bfloat16` for a GPU, `--autocast
bfloat16` for bf16 autocast over f32 weights on the CPU), or on a
checkpoint (`--model DIR` or `--model FILE.gguf`, loaded by
`from_pretrained`), and
prints one JSON line with its figures. `agentrl bench model` feeds this file
to the interpreter on stdin (`python - ARGS`); it can also be run by hand:

    python bench/torch_model.py --shape small

Workload (the defaults are the Rust side's):
- train: batch of B random sequences of T tokens, next-token cross-entropy
  (= minus the mean log-prob), backward, clip_grad_norm_(1.0), AdamW step;
  with `--reply-len R`, the loss on each sequence's last R tokens only and
  sequences in groups of `--group` sharing the rest (an RL update's batch);
- sample: B random prompts of P tokens, `generate` with the KV cache
  (use_cache=True), multinomial sampling at temperature 1 (no top-k / top-p
  truncation), exactly N new tokens (no end-of-sequence token).

Fairness: the same thread count (torch.set_num_threads, and one inter-op
thread), the same dtype, the same shape and token counts, one untimed
warm-up step/run before the timed ones, the fastest attention transformers
offers without extra packages (sdpa). On a GPU: full-precision float32
matmuls (no TF32, as candle's default), AdamW's default (foreach)
implementation, and torch.cuda.synchronize() before each clock reading.
Never needed by tests or CI.
"""

import argparse
import json
import sys
import time

SHAPES = {
    # vocab, hidden, layers, heads, kv heads, ffn
    "small": (512, 256, 4, 4, 2, 688),
    "medium": (512, 512, 8, 8, 2, 1376),
    "qwen2.5-0.5b": (151936, 896, 24, 14, 2, 4864),
}

# rope theta per shape (Qwen2.5's own for its shape).
ROPE_THETA = {"small": 10000.0, "medium": 10000.0, "qwen2.5-0.5b": 1000000.0}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sample-runs", type=int, default=2)
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--model", default=None)
    # CPU bf16 as users run it there: f32 weights, the ops under autocast.
    p.add_argument("--autocast", choices=["bfloat16"], default=None)
    p.add_argument("--reply-len", type=int, default=0)
    p.add_argument("--group", type=int, default=1)
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    import torch
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set by an earlier parallel region; harmless
    torch.manual_seed(0)

    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.model:
        import os

        from transformers import AutoModelForCausalLM

        path = args.model
        if path.endswith(".gguf"):
            folder, name = os.path.split(os.path.abspath(path))
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
        model = model.to(device=dev)
        vocab = model.config.vocab_size
    else:
        vocab, d, layers, heads, kv, ffn = SHAPES[args.shape]
        cfg = Qwen2Config(
            vocab_size=vocab,
            hidden_size=d,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=args.max_positions,
            tie_word_embeddings=True,
            rope_theta=ROPE_THETA[args.shape],
            rms_norm_eps=1e-6,
            use_cache=True,
            attn_implementation="sdpa",
        )
        model = Qwen2ForCausalLM(cfg).to(device=dev, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # ---- train: fwd + bwd + clip + AdamW, as the Rust side.
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (args.batch, args.seq_len), generator=gen)
    labels = batch.clone()
    if args.reply_len > 0:
        prompt = args.seq_len - args.reply_len
        for start in range(0, args.batch, args.group):
            batch[start : start + args.group, :prompt] = batch[start, :prompt]
        labels = batch.clone()
        labels[:, :prompt] = -100  # the loss reads the replies alone
    batch, labels = batch.to(dev), labels.to(dev)

    import contextlib

    def autocast():
        if args.autocast:
            return torch.autocast(device_type=dev.type, dtype=getattr(torch, args.autocast))
        return contextlib.nullcontext()

    def train_step():
        with autocast():
            out = model(input_ids=batch, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # The timed steps are one profiled range (cudaProfilerStart/Stop, read by
    # bench/kernel-profile), the timed sampling runs the next: as the Rust side.
    def profiled(start):
        if dev.type == "cuda":
            sync()
            (torch.cuda.profiler.start if start else torch.cuda.profiler.stop)()

    train_step()
    sync()
    profiled(True)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    sync()
    train_s = (time.perf_counter() - t0) / args.steps
    profiled(False)

    # ---- sample: KV-cache generation, temperature 1, exactly N new tokens.
    model.eval()
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen).to(dev)
    mask = torch.ones_like(prompts)

    def sample():
        with torch.no_grad(), autocast():
            out = model.generate(
                input_ids=prompts,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                use_cache=True,
                eos_token_id=None,
                pad_token_id=0,
            )
        return (out.shape[1] - args.prompt_len) * out.shape[0]

    sample()
    sync()
    profiled(True)
    t0 = time.perf_counter()
    new_tokens = sum(sample() for _ in range(args.sample_runs))
    sync()
    sample_s = time.perf_counter() - t0
    profiled(False)

    print(
        json.dumps(
            {
                "torch_version": torch.__version__,
                "transformers_version": transformers.__version__,
                "threads": torch.get_num_threads(),
                "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                "dtype": args.dtype,
                "autocast": args.autocast,
                "parameters": params,
                "train_step_s": train_s,
                "train_tokens_per_s": args.batch * args.seq_len / train_s,
                "sample_tokens_per_s": new_tokens / sample_s,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
