#!/usr/bin/python3
"""Checks a `diloco-ctl export` from Python PyTorch: parses the .safetensors file strictly (8-byte little-endian
header length, JSON header, 8-byte aligned data, F32 tensors laid back to back with no gaps), builds the Python copy
of the model (scripts/bench/train_reference.py's TransformerLM) from the exported model JSON, loads the tensors with
load_state_dict(strict=True) and compares its logits with the C++ model's logits on the same tokens.

The file is parsed here with json + torch.frombuffer because Debian 12 has no python3-safetensors package; the
parser follows the format's rules (https://github.com/huggingface/safetensors#format).
Exit code 0 when everything matches, 1 with one line saying what differs. Run with /usr/bin/python3 (Debian's
python3-torch). Usage:
  check_export.py --weights model.safetensors --model-json model.json --reference ref.json [--tol 1e-4]
where ref.json is {"tokens": [[...]], "logits_file": "logits.f32", "logits_shape": [B, T, V]} (float32 raw, C order).
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench"))
from train_reference import TransformerLM  # noqa: E402  (the benchmark's Python copy of worker/lm/arch_gpt.cc)


class Bad(Exception):
    pass


def read_safetensors(path):
    """Returns ({name: tensor}, metadata) and checks the layout rules of the format."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise Bad(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise Bad(f"{path}: header length {n} runs past the end of the file")
    if (8 + n) % 8 != 0:
        raise Bad(f"{path}: data does not start 8-byte aligned (header length {n})")
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise Bad(f"{path}: __metadata__ must map strings to strings")
    data = bytearray(buf[8 + n:])
    tensors, spans = {}, []
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise Bad(f"{path}: tensor {name} has dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        numel = 1
        for d in info["shape"]:
            numel *= d
        if end - begin != 4 * numel or not 0 <= begin <= end <= len(data):
            raise Bad(f"{path}: tensor {name}: offsets {begin}..{end} do not fit shape {info['shape']}")
        spans.append((begin, end))
        tensors[name] = torch.frombuffer(data, dtype=torch.float32, count=numel, offset=begin).reshape(info["shape"])
    spans.sort()
    cursor = 0
    for begin, end in spans:
        if begin != cursor:
            raise Bad(f"{path}: gap or overlap in the data at byte {cursor}")
        cursor = end
    if cursor != len(data):
        raise Bad(f"{path}: {len(data) - cursor} bytes after the last tensor")
    return tensors, metadata


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--model-json", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    try:
        tensors, metadata = read_safetensors(a.weights)
        with open(a.model_json) as f:
            cfg = json.load(f)
        if metadata.get("diloco.fingerprint") != cfg["fingerprint"]:
            raise Bad(f"fingerprint {metadata.get('diloco.fingerprint')} in the weights, "
                      f"{cfg['fingerprint']} in the JSON")
        if metadata.get("diloco.round") != str(cfg["round"]):
            raise Bad(f"round {metadata.get('diloco.round')} in the weights, {cfg['round']} in the JSON")
        model = TransformerLM(cfg["vocab_size"], cfg["seq_len"], cfg["n_layer"], cfg["n_head"], cfg["d_model"])
        try:
            model.load_state_dict(tensors, strict=True)
        except RuntimeError as e:
            raise Bad("load_state_dict: " + " ".join(str(e).split()))
        count = sum(p.numel() for p in model.parameters())
        if cfg["parameters"] != count:
            raise Bad(f"JSON says {cfg['parameters']} parameters, the model has {count}")
        with open(a.reference) as f:
            ref = json.load(f)
        logits_path = os.path.join(os.path.dirname(os.path.abspath(a.reference)), ref["logits_file"])
        with open(logits_path, "rb") as f:
            expected = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(ref["logits_shape"])
        model.eval()
        with torch.no_grad():
            got = model(torch.tensor(ref["tokens"], dtype=torch.int64))
        if list(got.shape) != list(expected.shape):
            raise Bad(f"logits shape {list(got.shape)} in Python, {list(expected.shape)} in C++")
        diff = (got - expected).abs().max().item()
        scale = expected.abs().max().item()
        if not diff <= a.tol:  # also catches NaN
            raise Bad(f"logits differ: max abs diff {diff:.3g} > tol {a.tol:g} (max |logit| {scale:.3g})")
    except Bad as e:
        print(f"check_export: FAIL: {e}")
        return 1
    print(f"check_export: OK: {len(tensors)} tensors, logits {list(expected.shape)} match, max abs diff {diff:.3g} "
          f"(tol {a.tol:g}, max |logit| {scale:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
