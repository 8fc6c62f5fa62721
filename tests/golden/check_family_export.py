#!/usr/bin/env python3
"""Checks a `diloco-ctl export --format hf` directory of a model imported from a golden case of
tests/golden/make_hf_families.py: transformers.AutoModelForCausalLM.from_pretrained(DIR, output_loading_info=True)
must load it as CLASS with no missing, unexpected or mismatched keys, and its logits on the golden tokens must equal
the golden logits (transformers' own, of the original directory) within TOL. Exit 0 with one "OK" line, else 1 with
one line saying what differs. Run with the reference stack (DILOCO_PYTHON). Usage:
  check_family_export.py --dir DIR --golden CASE_golden.safetensors --class Qwen3ForCausalLM [--tol 1e-4]
"""
import argparse
import sys

import torch
import transformers
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--class", dest="cls", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.float32,
                                                                    output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"check_family_export: loading info {problems}")
        return 1
    if type(model).__name__ != args.cls:
        print(f"check_family_export: loaded {type(model).__name__}, expected {args.cls}")
        return 1
    golden = load_file(args.golden)
    model.eval()
    with torch.no_grad():
        got = model(golden["tokens"].long()).logits.float()
    diff = (got - golden["logits"]).abs().max().item()
    if not diff <= args.tol:
        print(f"check_family_export: logits differ: max abs {diff:.3g} > {args.tol:g}")
        return 1
    print(f"check_family_export: OK {args.cls}, max abs logit difference {diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
