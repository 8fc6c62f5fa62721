// The run configuration: plain structs with the defaults. One YAML file (config/*.yaml) fills them for every process
// of a run; config_loader.h reads and checks it. Each key's doc and range is its row in Fields() (config_fields.cc),
// printed as docs/configuration.md. Key names are public: add keys, rename none. Plain data; not synchronized.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config_enums.h"

namespace diloco {

struct RunConfig {
  std::string name = "diloco";
  int64_t seed = 0;                        // theta_0 init and data sampling
  std::string output_dir = "runs/diloco";  // token cache, checkpoints, summaries
};

// The model (worker/lm/language_model.h). Shape keys describe the parameters; seq_len is the training context.
// A Hugging Face directory in init_from fills every key the YAML leaves unset (config/hf_model_config.h).
struct ModelConfig {
  // gpt (ours) | gpt2 (GPT2LMHeadModel) | llama (LlamaForCausalLM) | mistral | qwen2 | qwen3 (llama-shaped)
  ModelArch arch = ModelArch::kGpt;
  int64_t vocab_size = 512;
  int64_t seq_len = 64;  // training context (tokens per sample); <= max_positions
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t d_model = 128;
  int64_t n_kv_head = 0;       // llama: key/value heads (grouped-query attention); 0 = n_head
  int64_t ffn_hidden = 0;      // MLP width (llama: intermediate_size); 0 = 4 x d_model (gpt, gpt2), see FfnHidden()
  int64_t max_positions = 0;   // gpt2: rows of the position table (n_positions); llama: max_position_embeddings;
                               // 0 = seq_len. gpt's table always has seq_len rows.
  double rope_theta = 10000;   // llama: base of the rotary position embedding
  double norm_eps = 1e-5;      // gpt2: layer_norm_epsilon; llama: rms_norm_eps (gpt: fixed 1e-5)
  bool tie_embeddings = true;  // output head shares the token embedding (gpt, gpt2: always)
  int64_t bos_token_id = -1;   // -1: none
  int64_t eos_token_id = -1;   // -1: none; generation stops at it
  std::string init_from;  // theta_0 from our checkpoint or a Hugging Face model directory (paper: pretrained start)
  // Training recomputes each transformer block's forward during backward instead of keeping its activations
  // (worker/lm/checkpointed.h): less memory, about one more forward per step. Eval and generation are unaffected.
  bool activation_checkpointing = false;
  // Llama-shaped archs (llama, mistral, qwen2, qwen3): the head size (0 = d_model / n_head), the rotary embedding's
  // scaling (transformers' rope_parameters: worker/lm/rope.h) and mistral's sliding attention window (0 = none).
  int64_t head_dim = 0;
  RopeType rope_type = RopeType::kDefault;
  double rope_factor = 1;                   // linear, llama3, yarn: the context extension factor
  double rope_low_freq_factor = 1;          // llama3
  double rope_high_freq_factor = 4;         // llama3
  int64_t rope_original_max_positions = 0;  // llama3, yarn: the pretraining context; 0 = max_positions
  double rope_attention_factor = 0;         // yarn: cos/sin scale; 0 = 0.1 ln(rope_factor) + 1
  double rope_beta_fast = 32;               // yarn
  double rope_beta_slow = 1;                // yarn
  int64_t sliding_window = 0;               // mistral: a query sees the last sliding_window keys; 0 = all

  int64_t KvHeads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t MaxPositions() const { return max_positions > 0 ? max_positions : seq_len; }
  int64_t HeadDim() const { return head_dim > 0 ? head_dim : d_model / n_head; }
  int64_t RopeOriginalMaxPositions() const {
    return rope_original_max_positions > 0 ? rope_original_max_positions : MaxPositions();
  }
  // llama and the archs built from its code (worker/lm/llama_family.h).
  bool LlamaShaped() const {
    return arch == ModelArch::kLlama || arch == ModelArch::kMistral || arch == ModelArch::kQwen2 ||
           arch == ModelArch::kQwen3;
  }
  // llama with ffn_hidden 0: Meta's rule, 2/3 of 4 x d_model rounded up to a multiple of 256.
  int64_t FfnHidden() const {
    if (ffn_hidden > 0) return ffn_hidden;
    if (!LlamaShaped()) return 4 * d_model;
    return (8 * d_model / 3 + 255) / 256 * 256;
  }
};

// The training data (docs/models-and-data.md "Data"). data.text (one text file) or data.files (paths, directories,
// globs) in
// data.format; everything is tokenized once into the token cache (config/data_cache.h), which workers and the
// coordinator memory-map. Validation: data.val_files, else the last val_fraction of the documents (of the tokens for
// format tokens).
struct DataConfig {
  std::string text = "tests/data/tinyshakespeare.txt";  // one text file, one document (unused when files is set)
  std::vector<std::string> files;                       // inputs: files, directories (all files below, sorted) or globs
  DataFormat format = DataFormat::kText;                // of data.files: text (a file is a document) | jsonl | tokens
  std::string jsonl_field = "text";  // format jsonl: the string field holding a document (one JSON object a line)
  TokenDtype token_dtype = TokenDtype::kUint16;  // format tokens, raw files (no known header): uint16 | uint32
  std::vector<std::string> val_files;  // validation inputs (same format); empty: the tail val_fraction of the inputs
  double val_fraction = 0.1;           // the tail of the documents (tokens) kept for validation
  BadRecordPolicy on_bad_record = BadRecordPolicy::kFail;  // a jsonl line that is not JSON / lacks the field
  std::string cache_dir;                                   // token shards; default <run.output_dir>/data
  DataSplit split = DataSplit::kIid;  // worker shards: iid (interleaved blocks) | contiguous (one region each)
  DataSampling sampling = DataSampling::kRandom;  // random windows (with replacement) | sequential (epochs, no repeats)
  // A SentencePiece model or tokenizer.json to use instead of training one (its pieces must fit model.vocab_size); set
  // from a Hugging Face init_from directory's tokenizer.model, else its tokenizer.json, when unset.
  std::string tokenizer;
  int64_t tokenizer_threads = 0;    // encoding threads of diloco-tokenize; 0 = every core
  int64_t tokenizer_train_mb = 64;  // a tokenizer trained on the spot learns from the first this many MB of text
  // A Hugging Face model.init_from directory without a tokenizer.model / tokenizer.json and data.tokenizer unset:
  // false refuses the run (a new tokenizer's ids would not match the pretrained embeddings), true trains one anyway.
  bool train_tokenizer = false;
  bool trace_windows = false;  // workers append each training window they draw to <state_dir>/<id>.windows
};

struct InnerConfig {
  InnerOptimizerKind optimizer = InnerOptimizerKind::kAdamW;
  double lr = 2e-3;
  double weight_decay = 0.1;
  bool weight_decay_1d = true;  // 1-D tensors (norms, biases) decayed too; nanoGPT and Hugging Face use false
  double beta1 = 0.9;
  double beta2 = 0.95;
  int64_t warmup_steps = 50;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio at the run's last inner step
  double grad_clip = 1.0;     // max global grad norm; 0 disables
  int64_t batch_size = 16;
  // Gradient accumulation: a step's batch_size sequences run forward/backward micro_batch_size at a time (must
  // divide batch_size); the step, its loss and its data are those of the whole batch. 0 = the whole batch at once.
  int64_t micro_batch_size = 0;
  int64_t steps = 50;           // H: inner steps per round
  bool adaptive_steps = false;  // DyLU: the coordinator sets each worker's H from its speed
};

struct OuterConfig {
  OuterOptimizerKind optimizer =
      OuterOptimizerKind::kNesterov;  // nesterov | sgd (sgd with momentum 0 and lr 1 is FedAvg)
  double lr = 0.7;
  double momentum = 0.9;
  int64_t rounds = 20;                // T: outer rounds (async: outer.rounds x workers.count pushes)
  OuterMode mode = OuterMode::kSync;  // sync | async (each push applied when it arrives)
  int64_t delay_n = 0;                // async Delayed Nesterov: momentum updated every N pushes; 0 = workers.count
  int64_t max_staleness = 16;         // async: pushes computed more than this many versions ago are refused
  LatePolicy late_policy = LatePolicy::kDrop;  // a push refused as late: drop (restart from the new global) |
                                               // reuse_local (keep training from the worker's own parameters)
  // mean | clip | trimmed_mean | centered_clip (docs/operations.md "Robust aggregation and the non-finite guard")
  Aggregation aggregation = Aggregation::kMean;
  // clip: each push scaled to at most this x the round's median push norm
  double clip_factor = 1.0;
  // clip: token weights capped at this x the round's median token count; 0 = no cap
  double max_token_weight = 2.0;
  // clip, centered_clip, trimmed_mean: a member whose pushes lay far beyond the limits (outer.flag_margin) this many
  // rounds in a row is logged and shown as suspect; 0 = never
  int64_t flag_rounds = 3;
  // a push counts toward outer.flag_rounds when its norm was over this x the clip threshold (scaled by under
  // 1 / this; without a norm clip, this x the round's median norm), its component along the outer momentum lay this
  // x as far from the round's median as the bound, or (trimmed_mean) the trim kept under 1 / this of an even trim's
  // share of its coordinates
  double flag_margin = 2.0;
  // clip: each push's component along the outer momentum is lowered to at most the round's median component + this
  // x 1.4826 x their median absolute deviation (a stale or replayed delta leans on the momentum); trimmed_mean,
  // centered_clip: the same limit, not applied, for outer.flag_margin's test; 0 = off
  double momentum_bound = 1.5;
  // trimmed_mean: the pushes dropped at each end of every coordinate (lowered to (k - 1) / 2 for k pushes)
  int64_t trim = 1;
  // centered_clip: iterations of v += mean(clip_tau(x_i - v)) from the coordinate-wise median
  int64_t cclip_iterations = 3;
  // centered_clip: tau per chunk; 0 = the median over the pushes of |x_i - median| on that chunk
  double cclip_tau = 0;
  // trimmed_mean, centered_clip: chunks of each push held at most before the slowest push's catch up
  int64_t window_chunks = 4;
  // centered_clip: each push first scaled to at most clip_factor x the round's median norm (as clip does)
  bool cclip_norm_clip = true;
};

struct CoordinatorConfig {
  std::string listen = "127.0.0.1:50051";  // HOST:PORT; port 0 picks a free one
  int64_t min_workers = 1;                 // never close a round with fewer pushes
  double round_timeout_s = 600;            // close with >= min_workers pushes once a round is this old
  int64_t checkpoint_every = 5;            // rounds; 0 = only the final checkpoint
  std::string checkpoint_dir;              // default <run.output_dir>/checkpoints
  int64_t keep_checkpoints = 3;
  std::string replay_log_dir;  // "" = off; else theta_0 and every round's averaged pseudo-gradient (replay_log.h)
  int64_t eval_every = 1;      // rounds; also once before round 1; 0 = never
  int64_t eval_batches = 8;
  int64_t threads = 1;  // intra-op threads for the outer step and evaluation
  double heartbeat_interval_s = 1.0;
  double lease_s = 10.0;              // a member silent this long is marked lost
  int64_t max_members = 1024;         // active members at most; a Join beyond gets RESOURCE_EXHAUSTED
  int64_t grpc_memory_quota_mb = 32;  // gRPC's memory quota (ResourceQuota) and fixed receive windows; 0 = off
  std::string metrics_listen;         // HOST:PORT of the HTTP /metrics, /status.json and / page; "" = off
  std::string device = "cpu";  // cpu | cuda | cuda:N: where evaluation runs (theta and the outer step stay on the CPU)
};

struct WorkersConfig {
  int64_t count = 4;
  std::string device = "cpu";              // cpu | cuda | cuda:N
  int64_t threads = 1;                     // intra-op threads per worker
  double connect_timeout_s = 600;          // how long a worker retries to reach its coordinator
  double rpc_timeout_s = 60;               // deadline of each RPC (a stream: without progress)
  int64_t cluster_size = 1;                // processes per worker, data parallel inside (c10d Gloo)
  double cluster_timeout_s = 60;           // rendezvous and collective timeout inside a cluster
  bool check_replicas = false;             // check after every inner step that a cluster's ranks agree (tests)
  Precision precision = Precision::kFp32;  // fp32 | bf16: autocast the inner forward pass to bfloat16 (CUDA or CPU)
  bool allow_tf32 = true;                  // float32 matmuls in TF32 on a CUDA device (worker/lm/matmul_precision.h)
  double slowdown = 1.0;                   // >= 1: each inner step takes this many times its compute time (tests)
  // Each worker's local state (inner AdamW moments, data position, round), written after each push; a worker
  // restarted with the same --id resumes from it. "" = <run.output_dir>/worker-state.
  std::string state_dir;
  bool resume = true;  // false: a restarted worker starts cold (fresh moments, data from the start)
  // A cluster's inner step sharded over its ranks (ZeRO-1 optimizer: each rank keeps the AdamW moments of its slice;
  // ZeRO-2 gradients: also only its slice of the reduced gradient). Needs cluster_size > 1.
  Sharding sharding = Sharding::kNone;
};

struct CommConfig {
  int64_t chunk_bytes = 1 << 20;            // payload bytes per streamed chunk
  WireCodec codec = WireCodec::kFp32;       // pseudo-gradient push: fp32 | bf16 | fp16 | int8 | int4 | topk
  WireCodec pull_codec = WireCodec::kFp32;  // global parameters pull (lossless fp32 by default)
  bool error_feedback = false;              // worker keeps the quantization residual, adds it next round
  // Streaming DiLoCo (arXiv 2501.18512): the model is split into `fragments` groups of layers (strided), and one
  // fragment syncs every inner.steps / fragments inner steps, so each fragment still syncs every inner.steps.
  int64_t fragments = 1;
  int64_t overlap_steps = 0;  // inner steps a worker trains while its fragment is in flight
  double merge_alpha = 0.5;   // with overlap: local <- alpha * local + (1 - alpha) * global
  // How pushes travel: grpc (the PushPseudoGradient stream) or tcp (the same messages framed on a plain TCP
  // connection beside gRPC, proto/push_frames.h: fewer copies; plaintext, so not with security.tls_*).
  PushTransport transport = PushTransport::kGrpc;
  int64_t tcp_port = 0;  // transport tcp: the coordinator's push port (0: any free one)
  // codec topk (SparseLoCo, proto/topk_codec.h): per block of topk_chunk elements keep topk_per_chunk values, from
  // the error-feedback accumulator e <- error_decay * e + delta (always on with topk).
  int64_t topk_chunk = 4096;
  int64_t topk_per_chunk = 64;
  double error_decay = 0.95;
  // workers.cluster_size > 1: every rank pushes its slice of the pseudo-gradient and pulls its slice of theta on its
  // own connection (proto/PROTOCOL.md "Push and pull in parts"; worker/part_exchange.h); false: rank 0 alone.
  bool cluster_parts = false;
  // Sparse pulls (proto/PROTOCOL.md "Sparse pulls"): with codec topk, outer momentum 0, synchronous rounds, one
  // fragment and fp32 pulls, a worker holding the previous theta pulls only the round's changed positions.
  bool sparse_pulls = true;
  // The round's average of topk pushes (issue 30 item 2): all = ours, the token-weighted mean over every push (a
  // coordinate a worker did not send counts as 0 for it); senders = SparseLoCo's, each coordinate averaged over the
  // pushes that sent it (one more fp32 copy at the coordinator: the per-coordinate weights).
  TopkAverage topk_average = TopkAverage::kAll;
};

// Transport security (docs/operations.md "Security"). The same keys on every process: the coordinator serves with
// tls_cert/tls_key and, with tls_ca set, requires client certificates signed by it (mutual TLS); a worker or
// diloco-ctl verifies the coordinator with tls_ca and presents tls_cert/tls_key as its client identity. All empty:
// plaintext. token_file: a shared secret every RPC must carry (metadata "authorization: Bearer <token>").
struct SecurityConfig {
  std::string tls_cert;     // PEM certificate chain (server identity / client identity)
  std::string tls_key;      // PEM private key of tls_cert
  std::string tls_ca;       // PEM CA bundle: verifies the peer; on the coordinator: require mTLS
  std::string token_file;   // file holding the shared secret (trailing newline ignored)
  std::string server_name;  // clients: TLS name to verify instead of the address's host
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  InnerConfig inner;
  OuterConfig outer;
  CoordinatorConfig coordinator;
  WorkersConfig workers;
  CommConfig comm;
  SecurityConfig security;

  std::string CacheDir() const { return data.cache_dir.empty() ? run.output_dir + "/data" : data.cache_dir; }
  // The coordinator's rounds are fragment syncs: outer.rounds x comm.fragments of them, each after
  // inner.steps / comm.fragments inner steps. With one fragment these are plain DiLoCo rounds.
  // Outer steps of the run: fragment syncs with Streaming DiLoCo; applied pushes in async mode (each worker pushes
  // about outer.rounds times, as many pseudo-gradients as a synchronous run).
  int64_t SyncRounds() const {
    return outer.mode == OuterMode::kAsync ? outer.rounds * workers.count : outer.rounds * comm.fragments;
  }
  int64_t StepsPerSync() const { return inner.steps / comm.fragments; }
  std::string WorkerStateDir() const {
    return workers.state_dir.empty() ? run.output_dir + "/worker-state" : workers.state_dir;
  }
  std::string CheckpointDir() const {
    return coordinator.checkpoint_dir.empty() ? run.output_dir + "/checkpoints" : coordinator.checkpoint_dir;
  }
};

}  // namespace diloco
