#!/usr/bin/env python3
"""Bits per kept position of the topk codec on a real pseudo-gradient: fixed ceil(log2 B)-bit positions (the wire
format, proto/PROTOCOL.md) against Rice-coded gaps between ascending positions (best Rice parameter per push).

The pseudo-gradient: a small causal transformer (4 layers, d_model 256, byte-level, ~3.3M parameters) trained on
tests/data/tinyshakespeare.txt with AdamW (lr 1e-3) for H inner steps from its initialisation; delta = theta_0 -
theta_H, as a DiLoCo worker pushes it; each parameter tensor is blocked from its first element, as the codec does.
Not a test.  Usage: /work/main/.venv/bin/python scripts/bench/topk_positions.py [H=50]
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden"))
import topk_reference as ref  # noqa: E402


def pseudo_gradient(steps):
    torch.manual_seed(0)
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "tinyshakespeare.txt"),
                "rb").read()
    data = torch.tensor(list(text), dtype=torch.long)
    d, seq = 256, 128
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(256, d), "pos": torch.nn.Embedding(seq, d),
                                 "body": torch.nn.TransformerEncoder(layer, 4), "head": torch.nn.Linear(d, 256)})
    theta0 = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (16,))
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
        h = model["emb"](x) + model["pos"](torch.arange(seq))
        logits = model["head"](model["body"](h, mask=mask, is_causal=True))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [(t0 - p.detach()).reshape(-1).numpy() for t0, p in zip(theta0, model.parameters())]


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    block, keep = 4096, 64
    gaps, params = [], 0
    for delta in pseudo_gradient(steps):
        params += len(delta)
        for start in range(0, len(delta), block):
            chunk = delta[start:start + block]
            pos = ref.select(chunk, min(keep, len(chunk)))
            gaps.extend(np.diff(np.concatenate([[-1], pos])) - 1)
    fixed = len(gaps) * ref.position_bits(block)
    rice, r = min((ref.rice_bits(gaps, r), r) for r in range(12))
    print(f"{params} parameters, H = {steps}, {len(gaps)} kept positions (B {block}, k {keep})")
    print(f"fixed {ref.position_bits(block)}-bit positions: {fixed / 8:.0f} bytes ({fixed / len(gaps):.2f} bits each)")
    print(f"Rice-coded gaps (r = {r}): {rice / 8:.0f} bytes ({rice / len(gaps):.2f} bits each), "
          f"{100 * (1 - rice / fixed):.1f}% smaller")


if __name__ == "__main__":
    main()
