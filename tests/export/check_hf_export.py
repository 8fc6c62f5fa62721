"""Checks a `diloco-ctl export --format hf` directory with Hugging Face's own code: loads it with
transformers.AutoModelForCausalLM.from_pretrained(DIR) (fp32, eager attention), runs it on the reference tokens
and compares its logits with the C++ model's. Also checks the directory's files: config.json's architecture, and for
a sharded export the index (every tensor in exactly one listed shard, metadata.total_size = the bytes of all shards'
tensors). Exit code 0 when everything matches, 1 with one line saying what differs. Run with the reference stack's
interpreter (CMake's DILOCO_PYTHON, .venv/bin/python). Usage:
  check_hf_export.py --dir DIR --reference ref.json [--tol 1e-4] [--expect-shards N]
where ref.json is {"tokens": [[...]], "logits_file": "logits.f32", "logits_shape": [B, T, V]} (float32 raw, C order,
logits_file relative to ref.json's directory).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch


def check_index(d, expect_shards):
    index_path = os.path.join(d, "model.safetensors.index.json")
    if expect_shards <= 1:
        if os.path.exists(index_path) or not os.path.exists(os.path.join(d, "model.safetensors")):
            return "expected a single model.safetensors and no index"
        return None
    from safetensors import safe_open
    index = json.load(open(index_path))
    shards = sorted(set(index["weight_map"].values()))
    if len(shards) != expect_shards:
        return f"index lists {len(shards)} shards, expected {expect_shards}"
    total, seen = 0, set()
    for shard in shards:
        with safe_open(os.path.join(d, shard), framework="pt") as f:
            for name in f.keys():
                if index["weight_map"].get(name) != shard or name in seen:
                    return f"tensor {name} of {shard} is not mapped to it by the index"
                seen.add(name)
                t = f.get_tensor(name)
                total += t.numel() * t.element_size()
    if seen != set(index["weight_map"]):
        return "the index maps tensors that no shard holds"
    if index["metadata"]["total_size"] != total:
        return f"metadata.total_size {index['metadata']['total_size']} != {total} bytes in the shards"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--expect-shards", type=int, default=1)
    args = ap.parse_args()
    import transformers
    err = check_index(args.dir, args.expect_shards)
    if err:
        print(f"check_hf_export: {err}")
        return 1
    model = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    ref = json.load(open(args.reference))
    tokens = torch.tensor(ref["tokens"], dtype=torch.long)
    raw = np.fromfile(os.path.join(os.path.dirname(args.reference), ref["logits_file"]), dtype=np.float32)
    want = torch.from_numpy(raw).reshape(ref["logits_shape"])
    with torch.no_grad():
        got = model(tokens).logits.float()
    if list(got.shape) != list(want.shape):
        print(f"check_hf_export: logits shape {list(got.shape)} != {list(want.shape)}")
        return 1
    diff = (got - want).abs().max().item()
    if not diff <= args.tol:
        print(f"check_hf_export: logits differ: max abs {diff:.3g} > {args.tol:g} ({type(model).__name__})")
        return 1
    print(f"check_hf_export: OK {type(model).__name__}, max abs logit difference {diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
