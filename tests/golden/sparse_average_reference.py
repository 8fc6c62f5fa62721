"""Reference for the two averages of sparse pushes (issue 30 item 2), written from SparseLoCo (arXiv 2508.15706).

    sparse_average_reference.py --out DIR    writes DIR/sparse_average.txt for tests/unit/sparse_average_test.cc

Pushes i = 1..P each send values v_i at positions S_i (ascending) with token weight w_i. In float32, folding the
pushes in order: s_j = sum_i w_i v_ij over the pushes that sent j.
  all (ours, DiLoCo's token-weighted mean; an unsent coordinate counts as 0): delta_j = s_j / sum_i w_i
  senders (SparseLoCo: each coordinate averaged over the workers that sent it): delta_j = s_j / sum_{i sent j} w_i,
  0 where no push sent j.
File: "n P", then per push "w k", a line of k positions, a line of k values; then a line of n values for all and one
for senders. Floats as %.9g (exact for float32).
"""
import argparse
import os

import numpy as np


def averages(n, pushes):
    s = np.zeros(n, dtype=np.float32)
    senders = np.zeros(n, dtype=np.float32)
    total = 0.0
    for w, pos, val in pushes:
        s[pos] = s[pos] + np.float32(w) * val  # each product, then each sum, rounded to float32
        senders[pos] = senders[pos] + np.float32(w)
        total += w
    all_rule = s / np.float32(total)
    senders_rule = np.where(senders > 0, s / np.where(senders > 0, senders, 1), np.float32(0)).astype(np.float32)
    return all_rule.astype(np.float32), senders_rule


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rng = np.random.default_rng(30)
    n = 5000
    pushes = []
    for i, w in enumerate([1000, 3000, 2000]):
        k = 300
        pos = np.sort(rng.choice(n, size=k, replace=False))
        if i > 0:  # some positions sent by several pushes
            pos = np.unique(np.concatenate([pos[:-40], pushes[0][1][:40]]))
        val = (rng.standard_normal(len(pos)) * 1e-2).astype(np.float32)
        pushes.append((w, pos, val))
    all_rule, senders_rule = averages(n, pushes)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sparse_average.txt"), "w") as f:
        f.write(f"{n} {len(pushes)}\n")
        for w, pos, val in pushes:
            f.write(f"{w} {len(pos)}\n")
            f.write(" ".join(str(int(x)) for x in pos) + "\n")
            f.write(" ".join("%.9g" % x for x in val) + "\n")
        f.write(" ".join("%.9g" % x for x in all_rule) + "\n")
        f.write(" ".join("%.9g" % x for x in senders_rule) + "\n")


if __name__ == "__main__":
    main()
