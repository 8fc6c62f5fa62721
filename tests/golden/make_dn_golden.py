#!/usr/bin/python3
"""Golden values for coordinator/delayed_nesterov.h (tests/unit/delayed_nesterov_test.cc).

Delayed Nesterov, arXiv 2401.09135 Algorithm 3 with c = 0, in PyTorch float32, op for op:
  acc += g; t += 1
  if t % N == 0: m = beta * m + acc / N; theta += -lr * beta * m; acc = 0
  theta += -(lr / N) * g
Prints theta after each of 5 arrivals for N = 2, lr 0.7, beta 0.9, theta_0 and g_t below.
"""
import torch

lr, beta, N = 0.7, 0.9, 2
theta = torch.tensor([0.5, -1.25, 2.0, 0.125], dtype=torch.float32)
gs = [torch.tensor(v, dtype=torch.float32) for v in
      ([0.1, -0.2, 0.3, 0.05], [0.2, 0.1, -0.1, 0.0], [-0.3, 0.4, 0.2, 0.1], [0.05, 0.05, 0.05, -0.2],
       [0.15, -0.25, 0.35, 0.45])]
m = torch.zeros(4)
acc = torch.zeros(4)
for t, g in enumerate(gs, start=1):
    acc.add_(g)
    if t % N == 0:
        m = m.mul(beta).add_(acc, alpha=1.0 / N)
        theta.add_(m, alpha=-lr * beta)
        acc.zero_()
    theta.add_(g, alpha=-lr / N)
    print("{" + ", ".join(f"{x:.9g}f" for x in theta.tolist()) + "},")
