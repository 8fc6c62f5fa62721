// diloco-ctl: command-line client of a running coordinator.
//   diloco-ctl status --addr HOST:PORT [--json] [--watch [--interval S]]
//   diloco-ctl leave --addr HOST:PORT --id WORKER     (the worker abandons its round, leaves and exits 0)
//   diloco-ctl checkpoint --addr HOST:PORT            (write a checkpoint of the global state now)
//   diloco-ctl export --checkpoint F --config RUN.yaml [--set k=v] --format safetensors --out model.safetensors
//   diloco-ctl export --checkpoint F --config RUN.yaml --format hf --out DIR [--dtype fp32|bf16] [--max-shard-size B]
//   diloco-ctl config-reference                       (every config key as Markdown: docs/configuration.md)
// status, leave and checkpoint speak TLS and send the token as the run's security.* keys say: from --config RUN.yaml
// [--set k=v], or the flags --tls-ca, --tls-cert, --tls-key, --token-file, --server-name (which win).
// status, leave and checkpoint are a thin front end: they speak the protocol in proto/ and use nothing of
// coordinator/ or worker/. export works offline on a checkpoint file and needs the checkpoint reader and the model
// (scripts/ctl/export.h). Exit codes: 0 done; 2 bad input (a flag, the config, a missing file; which error codes count
// is each command's, kExportInput and kGenerateInput below); 1 any other failure (the coordinator unreachable or
// refusing, a corrupt checkpoint, an unwritable output). Every command's steps return absl::Status; Finish() is the one
// place that prints the error (one line on stderr, "diloco-ctl: error: ...") and picks the exit code.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "config/cli_flags.h"
#include "config/config_loader.h"
#include "config/config_reference.h"
#include "proto/diloco.grpc.pb.h"
#include "proto/status_json.h"
#include "proto/status_text.h"
#include "proto/transport_security.h"
#include "scripts/ctl/export.h"
#include "scripts/ctl/generate.h"

namespace {

void PrintHuman(const diloco::StatusReply& s) { fputs(diloco::StatusToText(s).c_str(), stdout); }

// Redraws the status table every interval_s until the run is complete. The request names the interval, so a
// completing coordinator waits for this watch to see `complete` before it exits (StatusRequest.watch_interval_ms); a
// coordinator gone before that (stopped, killed) is an error naming what was seen last.
absl::Status Watch(diloco::Coordinator::Stub& stub, const std::string& addr, double timeout_s, double interval_s,
                   const diloco::TransportSecurity& security) {
  std::optional<diloco::StatusReply> last;
  diloco::StatusRequest request;
  request.set_watch_interval_ms(std::max<int64_t>(1, static_cast<int64_t>(interval_s * 1000)));
  while (true) {
    grpc::ClientContext ctx;
    diloco::AttachToken(security, &ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000)));
    diloco::StatusReply reply;
    grpc::Status s = stub.GetStatus(&ctx, request, &reply);
    if (!s.ok()) {
      if (!last) return absl::UnavailableError("coordinator " + addr + ": " + s.error_message());
      return absl::UnavailableError(absl::StrCat("coordinator ", addr, " stopped answering (last seen: ", last->round(),
                                                 "/", last->rounds_total(), " rounds done, ", last->phase(),
                                                 "): ", s.error_message()));
    }
    printf("\033[H\033[2J");  // clear the terminal
    PrintHuman(reply);
    fflush(stdout);
    if (reply.phase() == "complete") return absl::OkStatus();
    last = std::move(reply);
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(interval_s * 1000)));
  }
}

// The transport security of status, leave and checkpoint: the security.* keys of the run config (if given), each
// overridden by its flag.
absl::StatusOr<diloco::TransportSecurity> LoadSecurity(const std::string& config_path,
                                                       const std::vector<std::string>& overrides,
                                                       diloco::TransportSecurityFiles flags) {
  if (!config_path.empty()) {
    auto security = diloco::LoadSecurityConfig(config_path, overrides);
    if (!security.ok()) return security.status();
    const diloco::SecurityConfig& c = *security;
    for (auto [flag, key] : {std::pair{&flags.tls_ca, &c.tls_ca}, std::pair{&flags.tls_cert, &c.tls_cert},
                             std::pair{&flags.tls_key, &c.tls_key}, std::pair{&flags.token_file, &c.token_file},
                             std::pair{&flags.server_name, &c.server_name}}) {
      if (flag->empty()) *flag = *key;
    }
  }
  return diloco::LoadTransportSecurity(flags);
}

absl::Status RunExport(const diloco::ExportOptions& options) {
  auto result = diloco::ExportCheckpoint(options);
  if (!result.ok()) return result.status();
  std::cout << "exported round " << result->round << " (" << result->parameters << " parameters) to "
            << result->weights_path << "; model config " << result->config_path;
  if (!result->tokenizer_path.empty()) std::cout << "; tokenizer " << result->tokenizer_path;
  if (!result->files.empty()) std::cout << "; " << result->files.size() << " files";
  std::cout << "\n";
  return absl::OkStatus();
}

// The flags of status, leave and checkpoint (the commands that speak to a coordinator).
struct RpcFlags {
  std::string addr, worker_id;
  bool json = false, watch = false;
  double timeout_s = 5, interval_s = 2;
  std::string run_config;
  std::vector<std::string> run_overrides;
  diloco::TransportSecurityFiles security;
};

struct RpcCommands {
  CLI::App* status;
  CLI::App* leave;
  CLI::App* checkpoint;
};

RpcCommands AddRpcCommands(CLI::App& app, RpcFlags& f) {
  CLI::App* status = app.add_subcommand("status", "print the run's status");
  status->add_flag("--json", f.json, "one JSON object instead of a table");
  status->add_flag("--watch", f.watch, "refresh the table until the run completes or the coordinator goes away");
  status->add_option("--interval", f.interval_s, "seconds between refreshes with --watch")
      ->check(diloco::PositiveSeconds());
  CLI::App* leave = app.add_subcommand("leave", "ask a worker to leave the run");
  leave->add_option("--id", f.worker_id, "worker id")->required();
  CLI::App* checkpoint = app.add_subcommand("checkpoint", "write a checkpoint now");
  for (CLI::App* sub : {status, leave, checkpoint}) {
    sub->add_option("--addr", f.addr, "coordinator address HOST:PORT")->required()->check(diloco::HostPortFlag());
    sub->add_option("--timeout", f.timeout_s, "seconds to wait for the coordinator")->check(diloco::PositiveSeconds());
    sub->add_option("--config", f.run_config, "the run's YAML config: its security.* keys (TLS, token) are used");
    sub->add_option("--set", f.run_overrides, "section.key=value override of --config (repeatable)");
    sub->add_option("--tls-ca", f.security.tls_ca, "CA bundle verifying the coordinator (turns TLS on)");
    sub->add_option("--tls-cert", f.security.tls_cert, "client certificate for mutual TLS (PEM)");
    sub->add_option("--tls-key", f.security.tls_key, "private key of --tls-cert (PEM)");
    sub->add_option("--token-file", f.security.token_file, "file holding the run's shared token");
    sub->add_option("--server-name", f.security.server_name, "TLS name to verify instead of the address's host");
  }
  return {status, leave, checkpoint};
}

CLI::App* AddExportCommand(CLI::App& app, diloco::ExportOptions& o) {
  CLI::App* export_cmd = app.add_subcommand("export", "write a checkpoint's model as safetensors + a model JSON");
  export_cmd->add_option("--checkpoint", o.checkpoint, "a coordinator checkpoint file")->required();
  export_cmd->add_option("--config", o.config, "the run's YAML config (supplies model:)")->required();
  export_cmd->add_option("--set", o.overrides, "section.key=value override of the config (repeatable)");
  export_cmd->add_option("--format", o.format,
                         "safetensors (our names + model JSON) | hf (a Hugging Face model directory)");
  export_cmd->add_option("--out", o.out, "output file, e.g. model.safetensors; with hf a directory")->required();
  export_cmd->add_option("--dtype", o.dtype, "hf: weights as fp32 | bf16");
  export_cmd->add_option("--max-shard-size", o.max_shard_size,
                         "hf: bytes per safetensors shard (above it: shards + index, as save_pretrained)");
  return export_cmd;
}

CLI::App* AddGenerateCommand(CLI::App& app, diloco::GenerateCommand& gen) {
  CLI::App* generate = app.add_subcommand("generate", "sample text from a checkpoint or a Hugging Face model");
  generate->add_option("--config", gen.config, "the run's YAML config (model:, data:)")->required();
  generate->add_option("--set", gen.overrides, "section.key=value override of the config (repeatable)");
  generate->add_option("--checkpoint", gen.checkpoint, "a coordinator checkpoint file");
  generate->add_option("--init-from", gen.init_from, "a Hugging Face model directory (config.json + safetensors)");
  generate->add_option("--prompt", gen.prompt, "prompt text (encoded with the run's tokenizer)");
  generate->add_option("--prompt-ids", gen.prompt_ids, "prompt token ids, e.g. 1,2,3");
  generate->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")->required();
  generate->add_option("--temperature", gen.temperature, "0: greedy (default); else sample from softmax(logits / T)");
  generate->add_option("--top-k", gen.top_k, "sample among the k most likely tokens (0: all)");
  generate->add_option("--seed", gen.seed, "sampling seed");
  generate->add_flag("--print-ids", gen.print_ids, "print only the new token ids, space-separated");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "go on past the model's EOS token");
  return generate;
}

// status, leave or checkpoint against the coordinator at f.addr; an RPC error names the coordinator (and a TLS hint).
absl::Status RunRpc(const RpcCommands& commands, const RpcFlags& f, const diloco::TransportSecurity& security) {
  grpc::ChannelArguments channel_args;
  diloco::ApplyChannelArguments(security, &channel_args);
  auto stub = diloco::Coordinator::NewStub(
      grpc::CreateCustomChannel(f.addr, diloco::MakeChannelCredentials(security), channel_args));
  if (*commands.status && f.watch) return Watch(*stub, f.addr, f.timeout_s, f.interval_s, security);
  grpc::ClientContext ctx;
  diloco::AttachToken(security, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int>(f.timeout_s * 1000)));
  grpc::Status s;
  if (*commands.status) {
    diloco::StatusReply reply;
    s = stub->GetStatus(&ctx, diloco::StatusRequest(), &reply);
    if (s.ok() && f.json) std::cout << diloco::StatusToJson(reply).dump() << "\n";
    if (s.ok() && !f.json) PrintHuman(reply);
  } else if (*commands.leave) {
    diloco::DrainRequest request;
    request.set_worker_id(f.worker_id);
    diloco::DrainReply reply;
    s = stub->Drain(&ctx, request, &reply);
    if (s.ok()) std::cout << "worker " << f.worker_id << " asked to leave; it leaves at its next heartbeat\n";
  } else if (*commands.checkpoint) {
    diloco::CheckpointReply reply;
    s = stub->Checkpoint(&ctx, diloco::CheckpointRequest(), &reply);
    if (s.ok()) std::cout << "checkpoint of round " << reply.round() << ": " << reply.path() << "\n";
  }
  if (s.ok()) return absl::OkStatus();
  const std::string hint = diloco::TlsHint(s.error_message(), security.client_tls());
  return absl::UnavailableError("coordinator " + f.addr + ": " + s.error_message() + (hint.empty() ? "" : "; ") + hint);
}

// The error codes each command counts as bad input (exit 2): a flag, the config, a missing or unusable input file.
constexpr absl::StatusCode kExportInput[] = {absl::StatusCode::kNotFound, absl::StatusCode::kInvalidArgument,
                                             absl::StatusCode::kUnimplemented};
constexpr absl::StatusCode kGenerateInput[] = {absl::StatusCode::kNotFound, absl::StatusCode::kInvalidArgument,
                                               absl::StatusCode::kFailedPrecondition};

// The one place diloco-ctl ends with an error: prints "diloco-ctl: error: [what: ]message" (one line on stderr) and
// returns 2 when the error's code is one of `bad_input`, else `other_exit`; 0 when `status` is OK.
int Finish(const absl::Status& status, const std::string& what, absl::Span<const absl::StatusCode> bad_input,
           int other_exit = 1) {
  if (status.ok()) return 0;
  std::cerr << "diloco-ctl: error: " << what << (what.empty() ? "" : ": ") << status.message() << "\n";
  return std::find(bad_input.begin(), bad_input.end(), status.code()) != bad_input.end() ? 2 : other_exit;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Control and inspect a running DiLoCo coordinator"};
  app.require_subcommand(1);
  RpcFlags rpc;
  const RpcCommands rpc_commands = AddRpcCommands(app, rpc);
  diloco::ExportOptions export_options;
  CLI::App* export_cmd = AddExportCommand(app, export_options);
  diloco::GenerateCommand gen;
  CLI::App* generate = AddGenerateCommand(app, gen);
  CLI::App* reference = app.add_subcommand("config-reference",
                                           "print every config key (type, default, allowed values, doc) as Markdown; "
                                           "docs/configuration.md is its output");
  if (const int code = diloco::ParseFlags(app, argc, argv); code >= 0) return code;
  if (*reference) return (std::cout << diloco::ConfigReferenceMarkdown() << std::flush) ? 0 : 1;
  if (*export_cmd) return Finish(RunExport(export_options), "export", kExportInput);
  if (*generate) return Finish(diloco::RunGenerate(gen), "generate", kGenerateInput);

  auto security = LoadSecurity(rpc.run_config, rpc.run_overrides, rpc.security);
  if (!security.ok()) return Finish(security.status(), "", {}, /*other_exit=*/2);  // bad security keys or files
  return Finish(RunRpc(rpc_commands, rpc, *security), "", {});                     // a failed RPC: exit 1
}
