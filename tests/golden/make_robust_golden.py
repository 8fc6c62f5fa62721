#!/usr/bin/python3
"""Golden values for the robust aggregation rules of coordinator/aggregation_rule.h, from numpy.

Writes tests/unit/robust_golden.inc. For each case: the pushes' pseudo-gradients (k rows of n values, float32), their
token counts, and what each rule makes of them:
  mean            sum_i w_i d_i / sum_i w_i                       (w_i = tokens capped at max_token_weight x median)
  clip            sum_i w_i s_i d_i / sum_i w_i, s_i = min(1, clip_factor x median_j |d_j| / |d_i|)  (Templar)
  trimmed_mean    per coordinate, the mean of the values left after dropping the `trim` smallest and largest
  centered_clip   BTARD's CenteredClip over the rows: v = coordinate-wise median, then `iterations` times
                  v += mean_i(clip_tau(d_i - v)), clip_tau(z) = z min(1, tau / |z|)
numpy.median of an even count is the mean of the two middle values. Cases cover an odd and an even count, ties at
the median, one push, an outlier (x1000) and an inflated token count.

Also the bound along the outer momentum (outer.momentum_bound, on top of clip): q_i = s_i d_i . m / |m| (the
projection of each clipped push onto the unit momentum m / |m|) lowered to at most median(q) + bound x 1.4826 x
median_i |q_i - median(q)|, and the clipped mean minus sum_i w_i (q_i - q'_i) / sum_i w_i x m / |m|. Cases: a push
leaning on m, an even count with a capped token count, projections tied at the median (a zero deviation), one push,
bound 0 (every projection above the median lowered to it), a push against the momentum (left alone) and honest
pushes.

Also writes tests/unit/coordinate_window_golden.inc: the streamed coordinate-wise rules of
coordinator/coordinate_window.h, each push cut into chunks of `chunk` values (the last one shorter) and the rule applied
to chunk s of every push: trimmed_mean with outer.trim `trim`; centered_clip with outer.cclip_iterations `iterations`
and outer.cclip_tau `tau`, where tau 0 means tau = the median over the pushes of |d_i - coordinate-wise median| of
that chunk. Cases: trim 0, an even count, trim lowered to (k - 1) / 2, one push, ties, an outlier (x1000). For
trimmed_mean also the coordinates at which each push's value was dropped (strictly outside the b-th smallest and
largest of its column, b the trim as lowered): the suspect count's measure.

Run with the project's Python:  /work/main/.venv/bin/python tests/golden/make_robust_golden.py
"""
import os

import numpy as np

CLIP_FACTOR = 1.0
MAX_TOKEN_WEIGHT = 2.0
TRIM = 1
TAU = 1.0
ITERATIONS = 3


def case(name, rows, tokens):
    d = np.array(rows, dtype=np.float32).astype(np.float64)
    t = np.array(tokens, dtype=np.float64)
    w = np.minimum(t, MAX_TOKEN_WEIGHT * np.median(t))
    norms = np.linalg.norm(d, axis=1)
    med = np.median(norms)
    s = np.where(norms > 0, np.minimum(1.0, CLIP_FACTOR * med / np.where(norms > 0, norms, 1.0)), 1.0)
    mean = (w[:, None] * d).sum(0) / w.sum()
    clip = ((w * s)[:, None] * d).sum(0) / w.sum()
    k = d.shape[0]
    b = min(TRIM, (k - 1) // 2)
    trimmed = np.sort(d, axis=0)[b:k - b].mean(0)
    v = np.median(d, axis=0)
    for _ in range(ITERATIONS):
        z = d - v
        zn = np.linalg.norm(z, axis=1)
        f = np.where(zn > 0, np.minimum(1.0, TAU / np.where(zn > 0, zn, 1.0)), 1.0)
        v = v + (f[:, None] * z).mean(0)
    return dict(name=name, d=d, tokens=t, weights=w, scales=s, mean=mean, clip=clip, trimmed=trimmed, cclip=v)


CASES = [
    case("kOddWithOutlier", [[0.1, -0.2, 0.3], [0.12, -0.1, 0.25], [-100.0, 200.0, -300.0], [0.05, -0.3, 0.2],
                             [0.2, -0.15, 0.35]], [1000, 1200, 1000, 900, 1100]),
    case("kEvenCount", [[0.3, 0.1, -0.2], [0.1, 0.4, 0.0], [-0.2, 0.2, 0.1], [1.0, -1.0, 2.0]], [500, 500, 700, 600]),
    case("kTiesAtTheMedian", [[0.3, 0.4, 0.0], [0.0, 0.3, 0.4], [0.4, 0.0, 0.3], [3.0, 4.0, 0.0], [0.1, 0.1, 0.1]],
         [100, 100, 100, 100, 100]),
    case("kOnePush", [[0.25, -0.5, 1.5]], [300]),
    case("kInflatedTokens", [[0.1, 0.2, 0.3], [0.2, 0.1, 0.0], [0.3, -0.1, 0.2]], [1000, 1000, 1000000]),
]


def bound_case(name, rows, tokens, momentum, bound=3.0):
    """outer.momentum_bound on top of clip: q_i = s_i d_i . m / |m|, lowered to at most median(q) + bound x 1.4826 x
    median|q - median(q)| (one-sided); the clipped mean loses sum_i w_i (q_i - q'_i) / sum_i w_i along m / |m|."""
    c = case(name, rows, tokens)
    m = np.array(momentum, dtype=np.float32).astype(np.float64)
    unit = m / np.linalg.norm(m)
    q = c["scales"] * (c["d"] @ unit)
    med = np.median(q)
    half = bound * 1.4826 * np.median(np.abs(q - med))
    bounded = np.minimum(q, med + half)
    out = c["clip"] - (c["weights"] * (q - bounded)).sum() / c["weights"].sum() * unit
    return dict(name=name, bound=bound, d=c["d"], tokens=c["tokens"], m=m, q=q, bounded=bounded, out=out)


def bound_cases():
    rng = np.random.default_rng(46)
    m = rng.normal(0.0, 1.0, size=6)
    honest = rng.normal(0.0, 0.1, size=(5, 6))
    leaning = honest.copy()
    leaning[4] = 0.3 * m / np.linalg.norm(m) + 0.02 * honest[4]  # a stale delta: honest norm, along m
    flat = np.zeros((5, 3))
    flat[:, 1:] = rng.normal(0.0, 1.0, size=(5, 2))
    flat[3, 0], flat[4, 0] = 0.5, -2.0  # three projections tie at 0 (MAD 0): 0.5 is lowered to it, -2 stays
    return [
        bound_case("kBoundLeaning", leaning, [1000] * 5, m),
        bound_case("kBoundEvenCountCappedTokens", leaning[1:], [1000, 1000, 900, 50000], m),
        bound_case("kBoundTiesAtTheMedian", flat, [100] * 5, [1.0, 0.0, 0.0]),
        bound_case("kBoundOnePush", leaning[4:], [300], m),
        bound_case("kBoundZero", honest, [1000] * 5, m, bound=0.0),
        bound_case("kBoundAgainstTheMomentum", -leaning, [1000] * 5, m),
        bound_case("kBoundHonest", honest, [1000, 1100, 900, 1000, 1000], m),
    ]


def write_bound_cases(lines):
    lines += ["struct BoundCase {", "  const char* name;", "  double bound;", "  int k, n;",
              "  std::vector<double> d, tokens, m, q, bounded, out;", "};",
              "inline const std::vector<BoundCase>& BoundCases() {", "  static const std::vector<BoundCase> cases = {"]
    for c in bound_cases():
        k, n = c["d"].shape
        fields = ", ".join(floats(c[key]) for key in ("d", "tokens", "m", "q", "bounded", "out"))
        lines.append('      {"%s", %r, %d, %d, %s},' % (c["name"], c["bound"], k, n, fields))
    lines += ["  };", "  return cases;", "}", ""]


def stream_case(name, rule, d, chunk, trim=1, iterations=3, tau=0.0):
    d = np.asarray(d, dtype=np.float32).astype(np.float64)
    k, n = d.shape
    out = np.zeros(n)
    dropped = np.zeros(k, dtype=np.int64)  # trimmed_mean: per push, the coordinates at which its value was dropped
    for start in range(0, n, chunk):
        x = d[:, start:start + chunk]
        if rule == "trimmed_mean":
            b = min(trim, (k - 1) // 2)
            s = np.sort(x, axis=0)
            out[start:start + chunk] = s[b:k - b].mean(0)
            if b > 0:  # outside [b-th smallest, b-th largest]; a value tied with the edge is kept
                dropped += ((x < s[b]) | (x > s[k - b - 1])).sum(1)
            continue
        m = np.median(x, axis=0)
        t = tau if tau > 0 else np.median(np.linalg.norm(x - m, axis=1))
        v = m
        for _ in range(iterations):
            z = x - v
            zn = np.linalg.norm(z, axis=1)
            f = np.where(zn > 0, np.minimum(1.0, t / np.where(zn > 0, zn, 1.0)), 1.0)
            v = v + (f[:, None] * z).mean(0)
        out[start:start + chunk] = v
    return dict(name=name, rule=rule, d=d, chunk=chunk, trim=trim, iterations=iterations, tau=tau, out=out,
                dropped=dropped)


def stream_cases():
    rng = np.random.default_rng(32)
    honest = rng.normal(0.0, 0.1, size=(5, 10))
    attacked = honest.copy()
    attacked[2] *= -1000.0
    ties = rng.integers(-2, 3, size=(4, 9)) * 0.25
    same = np.tile(rng.normal(0.0, 1.0, size=(1, 7)), (3, 1))
    return [
        stream_case("kTrimZero", "trimmed_mean", honest[:4], 4, trim=0),
        stream_case("kTrimEvenCount", "trimmed_mean", attacked[1:5], 4, trim=1),
        stream_case("kTrimOutlier", "trimmed_mean", attacked, 3, trim=1),
        stream_case("kTrimLowered", "trimmed_mean", honest[:3], 4, trim=5),
        stream_case("kTrimOnePush", "trimmed_mean", honest[:1], 4, trim=1),
        stream_case("kTrimTies", "trimmed_mean", ties, 4, trim=1),
        stream_case("kCClipOutlier", "centered_clip", attacked, 4),
        stream_case("kCClipEvenCount", "centered_clip", attacked[1:5], 3),
        stream_case("kCClipOnePush", "centered_clip", honest[:1], 4),
        stream_case("kCClipTies", "centered_clip", ties, 4, iterations=5),
        stream_case("kCClipAllEqual", "centered_clip", same, 3),
        stream_case("kCClipFixedTau", "centered_clip", attacked, 4, iterations=2, tau=0.05),
    ]


def write_stream_cases(out):
    lines = ["// Generated by tests/golden/make_robust_golden.py (numpy); do not edit.", "struct StreamCase {",
             "  const char* name;", "  const char* rule;", "  int k, n, chunk, trim, iterations;", "  double tau;",
             "  std::vector<double> d, out;", "  std::vector<int64_t> dropped;", "};",
             "inline const std::vector<StreamCase>& StreamCases() {",
             "  static const std::vector<StreamCase> cases = {"]
    for c in stream_cases():
        k, n = c["d"].shape
        lines.append('      {"%s", "%s", %d, %d, %d, %d, %d, %r, %s, %s, {%s}},' % (
            c["name"], c["rule"], k, n, c["chunk"], c["trim"], c["iterations"], c["tau"], floats(c["d"]),
            floats(c["out"]), ", ".join(str(v) for v in c["dropped"])))
    lines += ["  };", "  return cases;", "}", ""]
    with open(out, "w") as f:
        f.write("\n".join(lines))


def floats(values):
    return "{" + ", ".join("%.17g" % v for v in np.asarray(values).ravel()) + "}"


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "robust_golden.inc")
    lines = ["// Generated by tests/golden/make_robust_golden.py (numpy); do not edit.",
             "constexpr double kClipFactor = %r;" % CLIP_FACTOR, "constexpr double kMaxTokenWeight = %r;" % MAX_TOKEN_WEIGHT,
             "constexpr int kTrim = %d;" % TRIM, "constexpr double kTau = %r;" % TAU,
             "constexpr int kIterations = %d;" % ITERATIONS, "struct RobustCase {", "  const char* name;", "  int k, n;",
             "  std::vector<double> d, tokens, weights, scales, mean, clip, trimmed, cclip;", "};",
             "inline const std::vector<RobustCase>& Cases() {", "  static const std::vector<RobustCase> cases = {"]
    for c in CASES:
        k, n = c["d"].shape
        fields = ", ".join(floats(c[key]) for key in ("d", "tokens", "weights", "scales", "mean", "clip", "trimmed",
                                                      "cclip"))
        lines.append('      {"%s", %d, %d, %s},' % (c["name"], k, n, fields))
    lines += ["  };", "  return cases;", "}", ""]
    write_bound_cases(lines)
    with open(out, "w") as f:
        f.write("\n".join(lines))
    write_stream_cases(os.path.join(os.path.dirname(out), "coordinate_window_golden.inc"))


if __name__ == "__main__":
    main()
