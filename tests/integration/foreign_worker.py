#!/usr/bin/python3
"""A foreign worker: a client written only from proto/diloco.proto and proto/PROTOCOL.md, no code of this repo.

It generates the Python messages and stubs from the proto into a temporary directory (protoc + grpc_python_plugin),
starts a real coordinator on config/tiny.yaml (min_workers 1, so it is the only member), and then, as PROTOCOL.md
describes: GetStatus (run settings and fingerprint), Join with the ModelSpec, Pull the whole model and recompute the
fingerprint from the pulled names, shapes and dtypes, push a pseudo-gradient in chunks of at most chunk_bytes (round 1
raw fp32, round 2 bf16 encoded here, round 3 raw in two parts as a cluster of 2 would, PROTOCOL.md "Push and pull in
parts", round 4 sparse top-k encoded here from PROTOCOL.md "CODEC_TOPK"), wait for each round to close, pull again
and check the new parameters equal the outer step (Nesterov SGD with the config's outer lr and momentum) computed here
to 1e-6, pull theta in two parts, then Leave.

Usage: foreign_worker.py --coordinator BIN --source-dir DIR --scratch DIR [--cache-dir DIR]
Exit status 0 when every check holds; any failed check raises (non-zero exit) with what differed.
Needs python3-grpcio, python3-protobuf, python3-xxhash and numpy (scripts/setup); torch is used if importable.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

try:
    import numpy as np
    import xxhash
    import grpc  # noqa: F401 (imported again where the generated stubs need it)
    import google.protobuf  # noqa: F401
except ImportError as e:
    sys.exit(f"foreign_worker.py: {e}: install python3-grpcio python3-protobuf python3-xxhash (scripts/setup)")

# PROTOCOL.md "Fingerprint": the dtype names and the seed.
FINGERPRINT_SEED = 0x44694C6F436F
DTYPE_NAMES = {1: "Float", 2: "Half", 3: "BFloat16", 4: "Double", 5: "Long", 6: "Int", 7: "Char", 8: "Byte"}
DTYPE_NUMPY = {1: "<f4", 2: "<f2", 4: "<f8", 5: "<i8", 6: "<i4", 7: "i1", 8: "u1"}

WORKER_ID = "py-foreign.1"
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # config/tiny.yaml outer.lr, outer.momentum
CHUNK_BYTES = 4096  # set below with --set comm.chunk_bytes, so a tensor spans several chunks


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def generate_stubs(source_dir, out_dir):
    subprocess.run(["protoc", "-I", os.path.join(source_dir, "proto"), "--python_out", out_dir, "--grpc_python_out",
                    out_dir, "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.join(source_dir, "proto", "diloco.proto")], check=True)
    sys.path.insert(0, out_dir)


def fingerprint(specs):
    text = "".join(f"{name}:{DTYPE_NAMES[dtype]}:{'x'.join(str(d) for d in shape)};" for name, dtype, shape in specs)
    return "%016x" % xxhash.xxh64_intdigest(text.encode(), seed=FINGERPRINT_SEED)


def decode(chunk, pb):
    """A chunk's values as a float32 (or its own dtype) numpy array, per PROTOCOL.md "Codecs"."""
    data, n = chunk.data, chunk.count
    if chunk.codec == pb.CODEC_RAW:
        check(chunk.dtype in DTYPE_NUMPY, f"dtype {chunk.dtype} has no numpy type here")
        return np.frombuffer(data, dtype=DTYPE_NUMPY[chunk.dtype], count=n)
    if chunk.codec == pb.CODEC_BF16:
        return (np.frombuffer(data, dtype="<u2", count=n).astype(np.uint32) << 16).view(np.float32)
    if chunk.codec == pb.CODEC_FP16:
        return np.frombuffer(data, dtype="<f2", count=n).astype(np.float32)
    q = np.frombuffer(data, dtype=np.uint8)
    if chunk.codec == pb.CODEC_INT4:
        q = np.stack([q & 15, q >> 4], axis=1).reshape(-1)[:n]
    return q.astype(np.float32) * np.float32(chunk.scale) + np.float32(chunk.lo)


def encode_bf16(values):
    """float32 -> bfloat16 bits, round to nearest even (PROTOCOL.md "Codecs")."""
    bits = values.astype("<f4").view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


TOPK_BLOCK, TOPK_KEEP = 64, 4  # CODEC_TOPK: B and k of our top-k push (any valid pair; the coordinator reads them)


def topk_block(x, keep):
    """One block of CODEC_TOPK: its kept positions (ascending), bf16 levels r0 <= r1 and 2-bit codes (PROTOCOL.md)."""
    kept = min(keep, x.size)
    order = np.lexsort((np.arange(x.size), -np.abs(x)))[:kept]  # largest |x|, ties to the lower position
    pos = np.sort(order)
    mag = np.abs(x[pos]).astype(np.float32)
    lo, hi = mag.min(), mag.max()
    d = np.float32(hi - lo)
    r0, r1 = encode_bf16(np.array([lo + d * np.float32(0.25), hi - d * np.float32(0.25)], np.float32))
    f0, f1 = (np.array([r0, r1], np.uint32) << 16).view(np.float32)
    codes = (x[pos] < 0).astype(np.uint32) | ((mag > (f0 + f1) * np.float32(0.5)).astype(np.uint32) << 1)
    values = np.where(codes & 2, f1, f0) * np.where(codes & 1, np.float32(-1), np.float32(1))
    return pos, (int(r0), int(r1)), codes, values.astype(np.float32)


def pack_bits(values, width):
    """Little-endian bit stream, value i in bits [i width, (i + 1) width), padded to a byte."""
    out = bytearray((len(values) * width + 7) // 8)
    for i, v in enumerate(values):
        for b in range(width):
            if (int(v) >> b) & 1:
                out[(i * width + b) // 8] |= 1 << ((i * width + b) % 8)
    return bytes(out)


def encode_topk(part):
    """A CODEC_TOPK payload for `part` (its first element starts a block), and what the coordinator decodes."""
    levels, positions, codes = bytearray(), [], []
    decoded = np.zeros(part.size, np.float32)
    for start in range(0, part.size, TOPK_BLOCK):
        pos, (r0, r1), c, values = topk_block(part[start:start + TOPK_BLOCK], TOPK_KEEP)
        levels += bytes([r0 & 0xFF, r0 >> 8, r1 & 0xFF, r1 >> 8])
        positions += list(pos)
        codes += list(c)
        decoded[start + pos] = values
    bits = max(1, int(np.ceil(np.log2(TOPK_BLOCK))))
    return bytes(levels) + pack_bits(positions, bits) + pack_bits(codes, 2), decoded


def unavailable_retried(call):
    """call(), again while it ends UNAVAILABLE (PROTOCOL.md "Status codes": e.g. the run's last theta is pulled
    before its checkpoint is on disk, or the parameters moved on during the pull), for at most 60 s."""
    import grpc
    deadline, told = time.monotonic() + 60, False
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            if not told:
                print(f"pull: UNAVAILABLE ({e.details()}); pulling again")
                told = True
            time.sleep(0.1)


def pull(stub, pb, meta):
    """The whole model: [(name, dtype, shape, values)] in parameter order, and the header."""
    return unavailable_retried(lambda: pull_once(stub, pb, meta))


def pull_once(stub, pb, meta):
    header, tensors = None, []
    for message in stub.PullParameters(pb.PullRequest(meta=meta), timeout=60):
        if message.HasField("header"):
            check(header is None, "a second pull header")
            header = message.header
            continue
        c = message.chunk
        if not tensors or tensors[-1][0] != c.name:
            check(c.offset == 0, f"tensor {c.name} starts at offset {c.offset}")
            tensors.append((c.name, c.dtype, tuple(c.shape), []))
        check(c.offset == sum(len(v) for v in tensors[-1][3]), f"chunk of {c.name} at {c.offset} is not contiguous")
        tensors[-1][3].append(decode(c, pb))
    check(header is not None, "pull stream without a header")
    out = []
    for name, dtype, shape, parts in tensors:
        values = np.concatenate(parts)
        check(values.size == int(np.prod(shape)), f"{name}: {values.size} elements for shape {shape}")
        out.append((name, dtype, shape, values.reshape(shape).astype(np.float32)))
    check(header.num_tensors == len(out), f"header says {header.num_tensors} tensors, got {len(out)}")
    check(header.num_elements == sum(v.size for *_, v in out), "header num_elements differs from the chunks'")
    return header, out


def push(stub, pb, meta, delta, codec):
    """One pseudo-gradient push: a header, then chunks of at most CHUNK_BYTES of payload, in parameter order."""
    def messages():
        yield pb.PushMessage(header=pb.PushHeader(meta=meta, tokens=2560, inner_steps=10, loss=4.0, seconds=1.0))
        for name, dtype, shape, values in delta:
            flat = values.reshape(-1).astype(np.float32)
            per_chunk = CHUNK_BYTES // (2 if codec == pb.CODEC_BF16 else 4)  # topk: whole blocks, fewer bytes
            for offset in range(0, flat.size, per_chunk):
                part = flat[offset:offset + per_chunk]
                topk = {}
                if codec == pb.CODEC_TOPK:
                    data = encode_topk(part)[0]
                    topk = dict(topk_chunk=TOPK_BLOCK, topk_keep=TOPK_KEEP)
                elif codec == pb.CODEC_BF16:
                    data = encode_bf16(part).tobytes()
                else:
                    data = part.astype("<f4").tobytes()
                check(len(data) <= CHUNK_BYTES, "chunk larger than chunk_bytes")
                yield pb.PushMessage(chunk=pb.TensorChunk(name=name, dtype=dtype, shape=shape, offset=offset,
                                                          count=part.size, codec=codec, data=data, **topk))
    return stub.PushPseudoGradient(messages(), timeout=60)


def part_ranges(numel, parts):
    """PROTOCOL.md "Push and pull in parts", Layout: S = ceil(N / (n * A)) * A with A = chunk_bytes / 4."""
    align = CHUNK_BYTES // 4
    size = -(-numel // (parts * align)) * align
    return [(min(r * size, numel), min((r + 1) * size, numel)) for r in range(parts)]


def push_part(stub, pb, meta, delta, part, parts, begin, end):
    """Part `part` of `parts`: the raw fp32 chunks of flat elements [begin, end), never crossing a tensor's end."""
    def messages():
        yield pb.PushMessage(header=pb.PushHeader(meta=meta, tokens=2560, inner_steps=10, loss=4.0, seconds=1.0,
                                                  part=part, parts=parts,
                                                  range=pb.ElementRange(begin=begin, end=end)))
        base = 0
        for name, dtype, shape, values in delta:
            flat = values.reshape(-1).astype("<f4")
            at = max(begin, base)
            while at < min(end, base + flat.size):
                count = min(CHUNK_BYTES // 4, base + flat.size - at, end - at)
                yield pb.PushMessage(chunk=pb.TensorChunk(name=name, dtype=dtype, shape=shape, offset=at - base,
                                                          count=count, codec=pb.CODEC_RAW,
                                                          data=flat[at - base:at - base + count].tobytes()))
                at += count
            base += flat.size
    return stub.PushPseudoGradient(messages(), timeout=60)


def pull_range(stub, pb, meta, begin, end):
    """The flat elements [begin, end) of theta (a pull in parts), as one float32 array."""
    return unavailable_retried(lambda: pull_range_once(stub, pb, meta, begin, end))


def pull_range_once(stub, pb, meta, begin, end):
    header, values = None, []
    for message in stub.PullParameters(pb.PullRequest(meta=meta, range=pb.ElementRange(begin=begin, end=end)),
                                       timeout=60):
        if message.HasField("header"):
            header = message.header
        else:
            values.append(decode(message.chunk, pb))
    check(header is not None and header.num_elements == end - begin, f"ranged pull header {header}")
    check(header.range.begin == begin and header.range.end == end, f"ranged pull header range {header.range}")
    return np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32)


def as_received(delta, codec, pb):
    """What the coordinator decodes from our push (bf16 loses bits; top-k keeps a few per block; raw is exact)."""
    if codec == pb.CODEC_TOPK:
        per_chunk = CHUNK_BYTES // 4
        out = []
        for n, d, s, v in delta:
            flat = v.reshape(-1).astype(np.float32)
            parts = [encode_topk(flat[o:o + per_chunk])[1] for o in range(0, flat.size, per_chunk)]
            out.append((n, d, s, np.concatenate(parts).reshape(s)))
        return out
    if codec != pb.CODEC_BF16:
        return delta
    return [(n, d, s, (encode_bf16(v.reshape(-1)).astype(np.uint32) << 16).view(np.float32).reshape(s))
            for n, d, s, v in delta]


class OuterNesterov:
    """The outer step (PROTOCOL.md "Outer step"): torch.optim.SGD(lr, momentum, nesterov=True) on delta as gradient."""

    def __init__(self, theta):
        self.buf = None
        try:
            import torch
            self.torch = torch
            self.params = [torch.tensor(v.copy()) for *_, v in theta]
            self.opt = torch.optim.SGD(self.params, lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
        except ImportError:
            self.torch = None
            self.theta = [v.copy() for *_, v in theta]

    def step(self, delta):
        if self.torch is not None:
            for p, (*_, d) in zip(self.params, delta):
                p.grad = self.torch.tensor(d.copy())
            self.opt.step()
            return [p.detach().numpy().copy() for p in self.params]
        lr, mu = np.float32(OUTER_LR), np.float32(OUTER_MOMENTUM)
        grads = [d for *_, d in delta]
        self.buf = [g.copy() for g in grads] if self.buf is None else [mu * b + g for b, g in zip(self.buf, grads)]
        self.theta = [t - lr * (g + mu * b) for t, g, b in zip(self.theta, grads, self.buf)]
        return [t.copy() for t in self.theta]


def wait_for_round(stub, pb, round_, deadline_s=120):
    """Polls GetStatus until `round_` outer steps are done (a safety net, not a timing check)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        status = stub.GetStatus(pb.StatusRequest(), timeout=10)
        if status.round >= round_:
            return status
        time.sleep(0.05)
    raise AssertionError(f"round {round_} did not close within {deadline_s} s")


def wait_with_heartbeat(stub, pb, meta, round_, tries=120):
    """Heartbeats with wait_ms after a counted push for round_ until the answer says the round closed. A held
    answer is either the closed round or, after wait_ms, the unchanged one (asked again)."""
    for _ in range(tries):
        beat = stub.Heartbeat(pb.HeartbeatRequest(meta=meta, wait_ms=1000), timeout=30)
        # last_applied_base: the round of our newest push that a closed round counted (-1: none yet).
        check(beat.HasField("last_applied_base"), f"heartbeat without last_applied_base: {beat}")
        if beat.round > round_:
            check(beat.round == round_ + 1, f"held heartbeat round {beat.round}")
            check(beat.last_applied_base == round_, f"round {round_} closed with our push: {beat}")
            return beat
        check(beat.pushed and beat.round == round_, f"held heartbeat before the close: {beat}")
        check(beat.last_applied_base == round_ - 1, f"held heartbeat before the close: {beat}")
    raise AssertionError(f"no heartbeat saw round {round_ + 1} in {tries} held heartbeats")


def run(args, pb, pb_grpc, grpc, work):
    port_file = os.path.join(work, "addr")
    sets = [f"run.output_dir={work}/run", f"data.text={args.source_dir}/tests/data/tinyshakespeare.txt",
            "coordinator.min_workers=1", "coordinator.eval_every=0", "coordinator.checkpoint_every=0",
            "outer.rounds=4", f"comm.chunk_bytes={CHUNK_BYTES}"]
    if args.cache_dir:
        sets.append(f"data.cache_dir={args.cache_dir}")
    cmd = [args.coordinator, "--config", f"{args.source_dir}/config/tiny.yaml", "--port-file", port_file]
    for s in sets:
        cmd += ["--set", s]
    log = open(os.path.join(work, "coordinator.log"), "w")
    coordinator = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            check(coordinator.poll() is None, "the coordinator exited before listening")
            time.sleep(0.05)
        address = open(port_file).read().split("\n")[0]
        exercise(address, pb, pb_grpc, grpc)
    except BaseException:
        log.flush()
        sys.stderr.write(open(os.path.join(work, "coordinator.log")).read()[-6000:])
        raise
    finally:
        if coordinator.poll() is None:
            coordinator.send_signal(signal.SIGINT)
            try:
                coordinator.wait(60)
            except subprocess.TimeoutExpired:
                coordinator.kill()
                coordinator.wait()


def exercise(address, pb, pb_grpc, grpc):
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
    stub = pb_grpc.CoordinatorStub(channel)

    # 1. GetStatus: the run settings and the fingerprint.
    status = stub.GetStatus(pb.StatusRequest(), timeout=30)
    m = status.model
    check((m.vocab_size, m.seq_len, m.n_layer, m.n_head, m.d_model) == (128, 32, 1, 2, 32), f"model {m}")
    check((m.arch, m.n_kv_head, m.ffn_hidden, m.max_positions, m.untied_head) == ("gpt", 2, 128, 32, False),
          f"model defaults not resolved: {m}")
    check(status.lease_ms == 10000 and status.heartbeat_interval_ms == 500, "lease / heartbeat")
    check(status.chunk_bytes == CHUNK_BYTES and status.max_message_bytes == CHUNK_BYTES + (1 << 20), "limits")
    check(status.inner_steps == 10 and status.round == 0 and status.rounds_total == 4, "rounds")
    check(len(status.fingerprint) == 16, f"fingerprint {status.fingerprint!r}")

    # 2. Join with the ModelSpec the status shows; the reply repeats the settings.
    meta = pb.RequestMeta(worker_id=WORKER_ID, round=0, fingerprint=status.fingerprint)
    join = stub.Join(pb.JoinRequest(meta=meta, model=status.model, threads=1, device="cpu", fragments=1,
                                    cluster_size=2), timeout=30)
    check(join.lease_ms == 10000 and join.chunk_bytes == CHUNK_BYTES and join.inner_steps == 10, f"join {join}")
    check(join.max_message_bytes == status.max_message_bytes and join.fragments == 1, f"join {join}")
    check(join.model == status.model and join.round == 0 and 0 <= join.shard_index < join.shard_count, f"join {join}")

    stop = threading.Event()

    def heartbeats():  # PROTOCOL.md "Lease and heartbeat": every heartbeat_interval_ms while a member
        while not stop.wait(join.heartbeat_interval_ms / 1000):
            try:
                stub.Heartbeat(pb.HeartbeatRequest(meta=meta), timeout=10)
            except grpc.RpcError:
                pass
    beat = threading.Thread(target=heartbeats, daemon=True)
    beat.start()
    try:
        # 3. Pull theta_0; recompute the fingerprint from what came.
        header, theta = pull(stub, pb, meta)
        check(header.round == 0 and header.fragment == -1, f"pull header {header}")
        got = fingerprint([(n, d, s) for n, d, s, _ in theta])
        check(got == status.fingerprint, f"fingerprint computed here {got} != coordinator's {status.fingerprint}")
        check(theta[0][0] == "tok_emb.weight" and theta[0][2] == (128, 32), f"first tensor {theta[0][:3]}")
        print(f"foreign worker: {len(theta)} tensors, {header.num_elements} parameters, fingerprint {got} matches")

        outer = OuterNesterov(theta)
        rng = np.random.default_rng(19)
        for round_, codec in ((0, pb.CODEC_RAW), (1, pb.CODEC_BF16), (2, "parts"), (3, pb.CODEC_TOPK)):
            # 4. "Train": theta_local = theta + noise; the pseudo-gradient is theta - theta_local.
            delta = [(n, d, s, (-0.01 * rng.standard_normal(s)).astype(np.float32)) for n, d, s, _ in theta]
            meta.round = round_
            label = {pb.CODEC_RAW: "fp32", pb.CODEC_BF16: "bf16", "parts": "fp32 two-part",
                     pb.CODEC_TOPK: "topk"}[codec]
            if codec == "parts":  # part 1 first; the member counts only once part 0 is in too
                codec = pb.CODEC_RAW
                ranges = part_ranges(sum(v.size for *_, v in delta), 2)
                reply = push_part(stub, pb, meta, delta, 1, 2, *ranges[1])
                me = [w for w in stub.GetStatus(pb.StatusRequest(), timeout=10).workers if w.id == WORKER_ID][0]
                check((me.parts_received, me.parts, me.pushed_this_round) == (1, 2, False), f"after part 1: {me}")
                check(reply.round == round_, f"part 1 reply round {reply.round}")
                reply = push_part(stub, pb, meta, delta, 0, 2, *ranges[0])
            else:
                reply = push(stub, pb, meta, delta, codec)
            check(reply.round == round_, f"push reply round {reply.round}")
            expected = outer.step(as_received(delta, codec, pb))
            # 5. The round closes (the only member pushed): a held heartbeat (PROTOCOL.md "Waiting for the round to
            # close") answers with round t + 1 once it has; pull theta_{t+1} and compare with the outer step here.
            wait_with_heartbeat(stub, pb, meta, round_)
            wait_for_round(stub, pb, round_ + 1)
            meta.round = round_ + 1
            previous = theta
            header, theta = pull(stub, pb, meta)
            check(header.round == round_ + 1, f"pull header round {header.round}")
            worst = max(float(np.max(np.abs(v - e))) for (*_, v), e in zip(theta, expected))
            moved = max(float(np.max(np.abs(v - p))) for (*_, v), (*_, p) in zip(theta, previous))
            print(f"round {round_ + 1} ({label} push): max |coordinator - "
                  f"python outer step| = {worst:.3g}")
            check(worst <= 1e-6, f"round {round_ + 1}: parameters differ from the outer step by {worst}")
            check(moved > 1e-3, f"round {round_ + 1}: the parameters barely moved ({moved}): nothing was checked")
        # A pull in two parts: the slices of the whole theta.
        whole = np.concatenate([v.reshape(-1) for *_, v in theta])
        sliced = np.concatenate([pull_range(stub, pb, meta, b, e) for b, e in part_ranges(whole.size, 2)])
        check(np.array_equal(sliced, whole), "a pull in two parts differs from the whole pull")
        # A second push for a closed round is refused as stale (FAILED_PRECONDITION, PROTOCOL.md "Status codes").
        meta.round = 0
        try:
            push(stub, pb, meta, delta, pb.CODEC_RAW)
            raise AssertionError("a push for a closed round was accepted")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.FAILED_PRECONDITION, f"stale push: {e.code()} {e.details()}")
    finally:
        stop.set()
        beat.join()
    # 6. Leave; the status lists the member as left.
    meta.round = 3
    stub.Leave(pb.LeaveRequest(meta=meta, reason="foreign worker test done"), timeout=30)
    states = {w.id: w.state for w in stub.GetStatus(pb.StatusRequest(), timeout=30).workers}
    check(states.get(WORKER_ID) == "left", f"after Leave: {states}")
    print("foreign worker: joined, pulled, pushed 4 rounds (fp32, bf16, two parts, topk), outer steps match, left")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--cache-dir", default="")
    args = parser.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.scratch, prefix="foreign-worker-") as work:
        generate_stubs(args.source_dir, work)
        import grpc
        import diloco_pb2 as pb
        import diloco_pb2_grpc as pb_grpc
        run(args, pb, pb_grpc, grpc, work)


if __name__ == "__main__":
    main()
