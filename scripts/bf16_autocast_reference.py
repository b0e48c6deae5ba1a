#!/usr/bin/env python3
"""Write transformers' bf16-autocast log-probs for the qwen2-tiny fixture.

Not part of CI. The test `precision::bf16_log_probs_track_transformers_autocast`
(crates/model/tests/model/precision.rs) reads the file this writes: what
PyTorch's CPU bf16 autocast (f32 weights; linear layers, matmuls and
attention on bf16-rounded inputs with f32 sums) gives for the fixture's
`input_ids`, an independent reference for agentrl's bf16 products. Run it
with a Python that has torch and transformers:

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers
    /tmp/venv/bin/python scripts/bf16_autocast_reference.py \\
        crates/model/tests/data/qwen2-tiny
"""

import json
import sys
from pathlib import Path


def main(folder):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    ref = json.loads((folder / "reference.json").read_text())
    ids = torch.tensor([ref["input_ids"]])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    out = {}
    for name, autocast in [("f32", False), ("bf16_autocast", True)]:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits.float()[0]
        lp = torch.log_softmax(logits, dim=-1)
        nxt = ids[0, 1:]
        out[f"logprobs_{name}"] = lp[:-1].gather(1, nxt[:, None])[:, 0].tolist()
    out["made_with"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (folder / "reference_bf16.json").write_text(json.dumps(out, indent=1) + "\n")
    diff = max(abs(a - b) for a, b in zip(out["logprobs_f32"], out["logprobs_bf16_autocast"]))
    print(f"wrote {folder / 'reference_bf16.json'}: f32 vs bf16 autocast differ by up to {diff:.4g}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "crates/model/tests/data/qwen2-tiny")
