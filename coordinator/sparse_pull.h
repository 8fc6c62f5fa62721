// Sparse pulls, the coordinator's half (proto/PROTOCOL.md "Sparse pulls", proto/sparse_update.h): after a round whose
// outer step changes theta only where the averaged sparse pushes are non-zero (outer momentum 0), the round thread
// builds the pull messages of that step once (CODEC_UPDATE chunks over every tensor) and keeps them, with the hash
// of the new theta, until the next round replaces them. A worker that pulls with have_round = round - 1 gets them
// instead of theta. Memory: the encoded messages only, at most comm sparse bound (SparseUpdateLimit: 1/8 of theta's
// fp32 bytes), shared by every pull that streams them (PullPayload's slices point into them); a larger update is
// dropped and every pull is dense.
// SparseUpdate is immutable once built and shared by the pulls that stream it; the functions are pure.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "proto/diloco.pb.h"
#include "proto/named_tensors.h"

namespace diloco {

struct SparseUpdate {
  int64_t round = 0;                   // applying it to theta_{round - 1} gives theta_round
  uint64_t theta_hash = 0;             // ThetaHash(theta_round)
  std::vector<std::string> messages;   // serialized PullMessage{chunk}, in stream order
  std::vector<int64_t> payload_bytes;  // each message's chunk data bytes
  int64_t bytes = 0;                   // their sum
  int64_t changed = 0;                 // positions the step changes
};

// Whether `config`'s rounds can be pulled sparse: comm.sparse_pulls, codec topk, synchronous, outer momentum 0, a
// positive lr, one fragment and fp32 pulls. (Any lr: the step is sent as fl(-lr * delta), see sparse_update.h.)
bool SparsePullsApply(const Config& config);
// Why they do not ("" when they do): the first rule `config` breaks, as a line for the coordinator's log.
std::string SparsePullsOffReason(const Config& config);

// The most bytes a kept update may take: 1/8 of theta's fp32 bytes.
int64_t SparseUpdateLimit(int64_t num_params);

// The update of round `round` from theta_{round-1} to `theta` (theta_round, published after this) by the step
// fl(minus_lr * delta) (delta: the averaged pseudo-gradient, in the same order), in blocks of `block` elements and
// chunks of `chunk_elements` (a multiple of block). Null when the encoded update exceeds max_bytes.
std::shared_ptr<const SparseUpdate> BuildSparseUpdate(int64_t round, const NamedTensors& theta,
                                                      const std::vector<at::Tensor>& delta, float minus_lr,
                                                      int64_t block, int64_t chunk_elements, int64_t max_bytes);

}  // namespace diloco
