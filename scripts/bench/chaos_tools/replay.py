"""Replay of a run's outer steps (coordinator.replay_log_dir, coordinator/replay_log.h) through PyTorch's own
torch.optim.SGD(nesterov=True): theta_0 -> theta_R from the committed rounds' averaged pseudo-gradients, an
implementation independent of the coordinator's C++ outer step. Stateless; thread-safe."""
import os

import torch

from checkpoint_file import read_checkpoint


def replay(log_dir, rounds, lr, momentum):
    """{name: theta_R} after rounds 1..R; raises FileNotFoundError when a round's file is missing."""
    return replay_with_momentum(log_dir, rounds, lr, momentum)[0]


def replay_with_momentum(log_dir, rounds, lr, momentum):
    """({name: theta_R}, {name: momentum buffer after round R}) after rounds 1..R (buffers absent before round 1)."""
    theta0 = read_checkpoint(os.path.join(log_dir, "theta0.bin"))
    names = [n for n, _ in theta0["params"]]
    params = [torch.nn.Parameter(t.clone()) for _, t in theta0["params"]]
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True, dampening=0)
    for r in range(1, rounds + 1):
        delta = read_checkpoint(os.path.join(log_dir, f"delta-{r:08d}.bin"))
        if delta["round"] != r or [n for n, _ in delta["params"]] != names:
            raise ValueError(f"delta-{r:08d}.bin holds round {delta['round']} or other tensors")
        for p, (_, d) in zip(params, delta["params"]):
            p.grad = d.clone()
        opt.step()
    buffers = {n: opt.state[p]["momentum_buffer"] for n, p in zip(names, params) if "momentum_buffer" in opt.state[p]}
    return {n: p.detach() for n, p in zip(names, params)}, buffers
