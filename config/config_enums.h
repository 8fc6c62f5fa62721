// The config's modes as enums, each with the one table of its YAML names. config_loader.cc's Fields() parses and
// renders them through these tables (an unknown name is an error naming the key and the allowed values), and the code
// compares enums, never strings. Adding a value: one enumerator and one table row. Constant data; thread-safe.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>

namespace diloco {

enum class OuterMode { kSync, kAsync };             // outer.mode
enum class OuterOptimizerKind { kNesterov, kSgd };  // outer.optimizer
enum class LatePolicy { kDrop, kReuseLocal };       // outer.late_policy
// outer.aggregation (coordinator/aggregation_rule.h, coordinator/coordinate_window.h)
enum class Aggregation { kMean, kClip, kTrimmedMean, kCenteredClip };
enum class InnerOptimizerKind { kAdamW };                           // inner.optimizer
enum class DataSplit { kIid, kContiguous };                         // data.split
enum class WireCodec { kFp32, kBf16, kFp16, kInt8, kInt4, kTopk };  // comm.codec, comm.pull_codec (not topk)
enum class PushTransport { kGrpc, kTcp };                           // comm.transport
enum class Precision { kFp32, kBf16 };                              // workers.precision
enum class DataFormat { kText, kJsonl, kTokens };                   // data.format
enum class TokenDtype { kUint16, kUint32 };                         // data.token_dtype (raw token files)
enum class BadRecordPolicy { kFail, kSkip };                        // data.on_bad_record
enum class DataSampling { kRandom, kSequential };                   // data.sampling
enum class Sharding { kNone, kOptimizer, kGradients };              // workers.sharding
enum class TopkAverage { kAll, kSenders };                          // comm.topk_average
// model.arch (worker/lm/model_registry.cc)
enum class ModelArch { kGpt, kGpt2, kLlama, kMistral, kQwen2, kQwen3 };
// model.rope_type (worker/lm/rope.h)
enum class RopeType { kDefault, kLinear, kLlama3, kYarn, kDynamic };

// EnumNames<E>::kNames: every value of E with its YAML name, in declaration order.
template <typename E>
struct EnumNames;

template <>
struct EnumNames<OuterMode> {
  static constexpr std::array<std::pair<OuterMode, std::string_view>, 2> kNames{
      {{OuterMode::kSync, "sync"}, {OuterMode::kAsync, "async"}}};
};
template <>
struct EnumNames<OuterOptimizerKind> {
  static constexpr std::array<std::pair<OuterOptimizerKind, std::string_view>, 2> kNames{
      {{OuterOptimizerKind::kNesterov, "nesterov"}, {OuterOptimizerKind::kSgd, "sgd"}}};
};
template <>
struct EnumNames<LatePolicy> {
  static constexpr std::array<std::pair<LatePolicy, std::string_view>, 2> kNames{
      {{LatePolicy::kDrop, "drop"}, {LatePolicy::kReuseLocal, "reuse_local"}}};
};
template <>
struct EnumNames<Aggregation> {
  static constexpr std::array<std::pair<Aggregation, std::string_view>, 4> kNames{
      {{Aggregation::kMean, "mean"},
       {Aggregation::kClip, "clip"},
       {Aggregation::kTrimmedMean, "trimmed_mean"},
       {Aggregation::kCenteredClip, "centered_clip"}}};
};
template <>
struct EnumNames<InnerOptimizerKind> {
  static constexpr std::array<std::pair<InnerOptimizerKind, std::string_view>, 1> kNames{
      {{InnerOptimizerKind::kAdamW, "adamw"}}};
};
template <>
struct EnumNames<DataSplit> {
  static constexpr std::array<std::pair<DataSplit, std::string_view>, 2> kNames{
      {{DataSplit::kIid, "iid"}, {DataSplit::kContiguous, "contiguous"}}};
};
template <>
struct EnumNames<WireCodec> {
  static constexpr std::array<std::pair<WireCodec, std::string_view>, 6> kNames{{{WireCodec::kFp32, "fp32"},
                                                                                 {WireCodec::kBf16, "bf16"},
                                                                                 {WireCodec::kFp16, "fp16"},
                                                                                 {WireCodec::kInt8, "int8"},
                                                                                 {WireCodec::kInt4, "int4"},
                                                                                 {WireCodec::kTopk, "topk"}}};
};
template <>
struct EnumNames<PushTransport> {
  static constexpr std::array<std::pair<PushTransport, std::string_view>, 2> kNames{
      {{PushTransport::kGrpc, "grpc"}, {PushTransport::kTcp, "tcp"}}};
};
template <>
struct EnumNames<Precision> {
  static constexpr std::array<std::pair<Precision, std::string_view>, 2> kNames{
      {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
};

template <>
struct EnumNames<ModelArch> {
  static constexpr std::array<std::pair<ModelArch, std::string_view>, 6> kNames{{{ModelArch::kGpt, "gpt"},
                                                                                 {ModelArch::kGpt2, "gpt2"},
                                                                                 {ModelArch::kLlama, "llama"},
                                                                                 {ModelArch::kMistral, "mistral"},
                                                                                 {ModelArch::kQwen2, "qwen2"},
                                                                                 {ModelArch::kQwen3, "qwen3"}}};
};
template <>
struct EnumNames<RopeType> {
  static constexpr std::array<std::pair<RopeType, std::string_view>, 5> kNames{{{RopeType::kDefault, "default"},
                                                                                {RopeType::kLinear, "linear"},
                                                                                {RopeType::kLlama3, "llama3"},
                                                                                {RopeType::kYarn, "yarn"},
                                                                                {RopeType::kDynamic, "dynamic"}}};
};

template <>
struct EnumNames<DataFormat> {
  static constexpr std::array<std::pair<DataFormat, std::string_view>, 3> kNames{
      {{DataFormat::kText, "text"}, {DataFormat::kJsonl, "jsonl"}, {DataFormat::kTokens, "tokens"}}};
};
template <>
struct EnumNames<TokenDtype> {
  static constexpr std::array<std::pair<TokenDtype, std::string_view>, 2> kNames{
      {{TokenDtype::kUint16, "uint16"}, {TokenDtype::kUint32, "uint32"}}};
};
template <>
struct EnumNames<BadRecordPolicy> {
  static constexpr std::array<std::pair<BadRecordPolicy, std::string_view>, 2> kNames{
      {{BadRecordPolicy::kFail, "fail"}, {BadRecordPolicy::kSkip, "skip"}}};
};
template <>
struct EnumNames<DataSampling> {
  static constexpr std::array<std::pair<DataSampling, std::string_view>, 2> kNames{
      {{DataSampling::kRandom, "random"}, {DataSampling::kSequential, "sequential"}}};
};
template <>
struct EnumNames<Sharding> {
  static constexpr std::array<std::pair<Sharding, std::string_view>, 3> kNames{
      {{Sharding::kNone, "none"}, {Sharding::kOptimizer, "optimizer"}, {Sharding::kGradients, "gradients"}}};
};

// The YAML name of a value ("" for a value outside the table, which a cast could make).
template <typename E>
std::string_view EnumName(E value) {
  for (const auto& [v, name] : EnumNames<E>::kNames) {
    if (v == value) return name;
  }
  return "";
}

// The value named `name`; false when no value has that name.
template <typename E>
bool EnumFromName(std::string_view name, E* value) {
  for (const auto& [v, n] : EnumNames<E>::kNames) {
    if (n == name) {
      *value = v;
      return true;
    }
  }
  return false;
}

template <>
struct EnumNames<TopkAverage> {
  static constexpr std::array<std::pair<TopkAverage, std::string_view>, 2> kNames{
      {{TopkAverage::kAll, "all"}, {TopkAverage::kSenders, "senders"}}};
};

// "'a', 'b' or 'c'": the allowed names, for error messages.
template <typename E>
std::string EnumChoices() {
  std::string out;
  const auto& names = EnumNames<E>::kNames;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += "'" + std::string(names[i].second) + "'";
  }
  return out;
}

}  // namespace diloco
