"""Checks a coordinator checkpoint against an independent replay of its run (issue 32 item 4's integration test,
tests/integration/robust_test.cc): theta and the outer momentum in CHECKPOINT must equal torch.optim.SGD(nesterov)
stepped from the replay log's theta_0 through the committed rounds' averaged pseudo-gradients only
(coordinator.replay_log_dir, coordinator/replay_log.h; scripts/bench/chaos_tools/replay.py). A round that was
stepped and then refused, if it left any trace in theta or the momentum, makes them differ.
Usage: check_replay.py REPLAY_DIR CHECKPOINT LR MOMENTUM [TOL]. Prints the largest differences; exit 0 when within TOL."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../scripts/bench/chaos_tools"))
from checkpoint_file import read_checkpoint  # noqa: E402
from replay import replay_with_momentum  # noqa: E402


def main():
    log_dir, path, lr, momentum = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-5
    ckpt = read_checkpoint(path)
    theta, buffers = replay_with_momentum(log_dir, ckpt["round"], lr, momentum)
    names = [n for n, _ in ckpt["params"]]
    theta_diff = max((t - theta[n]).abs().max().item() for n, t in ckpt["params"])
    momentum_diff = max((m - buffers[n]).abs().max().item() for n, m in zip(names, ckpt["momentum"]))
    scale = max(t.abs().max().item() for _, t in ckpt["params"])
    print(f"round {ckpt['round']}: max |theta - replay| {theta_diff:.3g}, max |momentum - replay| {momentum_diff:.3g}"
          f" (max |theta| {scale:.3g}, {len(ckpt['momentum'])} momentum tensors)")
    ok = len(ckpt["momentum"]) == len(names) and theta_diff <= tol and momentum_diff <= tol
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
