"""Reader of the coordinator's checkpoint format (proto/checkpoint.h), written from the format description alone, with
its own xxHash64 (the checksum the file ends with), so that a checkpoint can be checked without our C++ reader.
read_checkpoint(path) -> dict(round, fingerprint, params [(name, torch.Tensor)], momentum [...], evals [...],
theta_id, members_config, members [dict(id, shard_index, shard_reader, cluster_size, inner_steps, last_applied_base,
active)], earlier_theta_ids [dict(round, theta_id)]);
raises CheckpointError for any file that does not verify. Stateless; thread-safe."""
import struct

import torch

MASK = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                      0x27D4EB2F165667C5)


class CheckpointError(Exception):
    pass


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK


def _round(acc, lane):
    acc = (acc + lane * P2) & MASK
    return (_rotl(acc, 31) * P1) & MASK


def _merge(acc, val):
    acc ^= _round(0, val)
    return (acc * P1 + P4) & MASK


def xxh64(data, seed=0):
    """XXH64 (the reference algorithm, https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md)."""
    n = len(data)
    i = 0
    if n >= 32:
        v1, v2, v3, v4 = (seed + P1 + P2) & MASK, (seed + P2) & MASK, seed, (seed - P1) & MASK
        stripes = n // 32
        for a, b, c, d in struct.iter_unpack("<4Q", memoryview(data)[:stripes * 32]):
            v1 = _rotl((v1 + a * P2) & MASK, 31) * P1 & MASK
            v2 = _rotl((v2 + b * P2) & MASK, 31) * P1 & MASK
            v3 = _rotl((v3 + c * P2) & MASK, 31) * P1 & MASK
            v4 = _rotl((v4 + d * P2) & MASK, 31) * P1 & MASK
        i = stripes * 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + P5) & MASK
    h = (h + n) & MASK
    while i + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * P1 + P4) & MASK
        i += 8
    if i + 4 <= n:
        (k,) = struct.unpack_from("<I", data, i)
        h ^= (k * P1) & MASK
        h = (_rotl(h, 23) * P2 + P3) & MASK
        i += 4
    while i < n:
        h ^= (data[i] * P5) & MASK
        h = (_rotl(h, 11) * P1) & MASK
        i += 1
    h ^= h >> 33
    h = (h * P2) & MASK
    h ^= h >> 29
    h = (h * P3) & MASK
    h ^= h >> 32
    return h


class _Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise CheckpointError(f"truncated at byte {self.pos}")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def string(self):
        n = self.take("<I")
        if self.pos + n > len(self.data):
            raise CheckpointError(f"truncated string at byte {self.pos}")
        s = bytes(self.data[self.pos:self.pos + n]).decode()
        self.pos += n
        return s

    def floats(self, count):
        size = 4 * count
        if self.pos + size > len(self.data):
            raise CheckpointError(f"truncated tensor data at byte {self.pos}")
        t = torch.frombuffer(bytearray(self.data[self.pos:self.pos + size]), dtype=torch.float32) if count else \
            torch.zeros(0)
        self.pos += size
        return t


def read_checkpoint(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8 + 4 + 8 or data[:8] != b"DLCOCKPT":
        raise CheckpointError(f"{path}: bad magic or too short ({len(data)} bytes)")
    (stored,) = struct.unpack_from("<Q", data, len(data) - 8)
    if xxh64(memoryview(data)[:len(data) - 8]) != stored:
        raise CheckpointError(f"{path}: checksum mismatch")
    c = _Cursor(memoryview(data)[:len(data) - 8])
    c.pos = 8
    version = c.take("<I")
    if version not in (1, 2, 3, 4, 5):
        raise CheckpointError(f"{path}: version {version}")
    out = {"round": c.take("<q"), "fingerprint": c.string(), "params": [], "momentum": [], "evals": []}
    for _ in range(c.take("<I")):
        name = c.string()
        ndim = c.take("<I")
        dims = [c.take("<q") for _ in range(ndim)]
        numel = 1
        for d in dims:
            numel *= d
        out["params"].append((name, c.floats(numel).reshape(dims)))
    momentum = c.take("<I")
    if momentum not in (0, len(out["params"])):
        raise CheckpointError(f"{path}: {momentum} momentum tensors for {len(out['params'])} parameters")
    for i in range(momentum):
        shape = out["params"][i][1].shape
        out["momentum"].append(c.floats(out["params"][i][1].numel()).reshape(shape))
    for _ in range(c.take("<I")):
        if version == 1:
            r, loss = c.take("<qd")
            out["evals"].append({"round": r, "val_loss": loss})
        else:
            r, loss, tokens, pushed = c.take("<qdqq")
            out["evals"].append({"round": r, "val_loss": loss, "tokens": tokens, "bytes_pushed_committed": pushed})
    out["theta_id"], out["members_config"], out["members"] = 0, "", []
    if version >= 3:
        out["theta_id"] = c.take("<Q")
        out["members_config"] = c.string()
        for _ in range(c.take("<I")):
            member = {"id": c.string()}
            (member["shard_index"], member["shard_reader"], member["cluster_size"], member["inner_steps"],
             member["last_applied_base"]) = c.take("<iiiqq")
            member["active"] = version < 4 or c.take("<B") == 1
            if version >= 5:
                member["rounds_contributed"], member["tokens"], member["bytes_pushed"] = c.take("<qqq")
            out["members"].append(member)
    out["earlier_theta_ids"] = []
    if version >= 4:
        for _ in range(c.take("<I")):
            r, theta_id = c.take("<qQ")
            out["earlier_theta_ids"].append({"round": r, "theta_id": theta_id})
    out["totals"] = None
    if version >= 5:
        recorded, tokens, pushed, dp = c.take("<Bqqq")
        if recorded:
            out["totals"] = {"tokens_committed": tokens, "bytes_pushed_committed": pushed, "dp_equivalent_bytes": dp}
    if c.pos != len(c.data):
        raise CheckpointError(f"{path}: {len(c.data) - c.pos} bytes after the members")
    return out


def read_safetensors(path):
    """{name: torch.Tensor} of a float32 safetensors file (the format: u64 header size, JSON header, data)."""
    import json
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            raise CheckpointError(f"{path}: {name} is {meta['dtype']}, expected F32")
        a, b = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(meta["shape"])
    return out
