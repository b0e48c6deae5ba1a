#!/usr/bin/env python3
"""Check that a LoRA adapter saved by agentrl loads in PEFT and gives agentrl's logits.

Not part of CI. Run it with a Python that has torch, transformers and peft,
in a throw-away venv:

    python3 -m venv /tmp/venv-peft && /tmp/venv-peft/bin/pip install torch transformers peft
    cargo build -p agentrl
    /tmp/venv-peft/bin/python scripts/peft_check.py --bin target/debug/agentrl

Without --checkpoint it first trains a short seeded LoRA run on
configs/smoke.toml (a few seconds) with a large learning rate, so that the
adapter moves the logits well away from the base model's. Then, on one chat
prompt:

1. agentrl's logits of the adapted model (`agentrl generate --logits`);
2. transformers' base model from the checkpoint directory plus PEFT's
   `PeftModel.from_pretrained(base, CHECKPOINT/adapter)`: the same logits;
3. PEFT's `merge_and_unload()` against `agentrl merge-lora`'s checkpoint
   loaded in transformers.

Prints the max abs differences (and how far the adapter moves the base's
logits, which says the comparison means something); exits 1 when a
difference is above --tolerance.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def agentrl(bin_path, *args):
    out = subprocess.run([bin_path, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"agentrl {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def train_run(bin_path, work):
    run = os.path.join(work, "run")
    agentrl(
        bin_path,
        "train",
        os.path.join(ROOT, "configs", "smoke.toml"),
        "lora.enabled=true",
        "lora.r=4",
        "lora.lora_alpha=8",
        # GAE gives the smoke run a gradient even when its rewards all agree.
        "algorithm.adv_estimator=gae",
        "actor.lr=0.05",
        "trainer.total_training_steps=3",
        "--out",
        run,
        "--quiet",
    )
    with open(os.path.join(run, "checkpoints", "latest")) as f:
        return os.path.join(run, "checkpoints", f.read().strip())


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "agentrl"))
    ap.add_argument("--checkpoint", help="a checkpoint with adapter/ (default: train one)")
    ap.add_argument("--prompt", default="pull the arm that pays")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as work:
        ckpt = args.checkpoint or train_run(args.bin, work)
        adapter = os.path.join(ckpt, "adapter")
        out = os.path.join(work, "logits.json")
        agentrl(args.bin, "generate", "--model", ckpt, "--prompt", args.prompt,
                "--max-new-tokens", "1", "--temperature", "0", "--logits", out)
        with open(out) as f:
            ours = json.load(f)
        ids = ours["ids"]
        ours = torch.tensor(ours["logits"], dtype=torch.float64)

        base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
        base_logits = logits_of(base, ids)
        peft_model = PeftModel.from_pretrained(base, adapter)
        peft_model.eval()
        theirs = logits_of(peft_model, ids)

        merged_dir = os.path.join(work, "merged")
        agentrl(args.bin, "merge-lora", "--policy", ckpt, "--out", merged_dir)
        our_merge = logits_of(AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32), ids)
        peft_merge = logits_of(peft_model.merge_and_unload(), ids)

    diffs = {
        "agentrl vs transformers+PEFT (adapter)": (ours - theirs).abs().max().item(),
        "agentrl merge-lora vs PEFT merge_and_unload": (our_merge - peft_merge).abs().max().item(),
    }
    moved = (theirs - base_logits).abs().max().item()
    print(f"checkpoint: {ckpt}")
    print(f"prompt: {len(ids)} tokens, vocab {ours.shape[1]}")
    print(f"the adapter moves the base's logits by up to {moved:.3e}")
    for what, d in diffs.items():
        print(f"max abs diff, {what}: {d:.3e}")
    if moved < 10 * args.tolerance:
        sys.exit("the adapter barely changes the logits: the comparison proves nothing")
    if any(d > args.tolerance for d in diffs.values()):
        sys.exit(f"a difference is above the tolerance {args.tolerance}")
    print("OK")


if __name__ == "__main__":
    main()
