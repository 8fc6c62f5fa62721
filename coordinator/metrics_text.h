// StatusReply -> Prometheus text exposition format (version 0.0.4), the body of the coordinator's HTTP /metrics.
// Pure formatting: it owns nothing, reads only its argument, and is thread-safe (the HTTP server threads call it on
// a StatusReply they got from CoordinatorCore::Status(), itself thread-safe).
//
// Every figure comes from the StatusReply; a figure the coordinator does not have yet is left out rather than
// written as 0 (no validation loss before the first eval; no per-worker loss or tokens/s before that worker's first
// push). Metric names and meanings are listed in docs/operations.md ("Observability") and in metrics_text.cc.
#pragma once

#include <string>

#include "proto/diloco.pb.h"

namespace diloco {

// Content-Type of the text MetricsText returns.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The whole exposition: HELP and TYPE lines, then samples, one metric family after the other, newline-terminated.
std::string MetricsText(const StatusReply& status);

// A label value escaped as the format requires (backslash, double quote and newline).
std::string EscapeLabelValue(const std::string& value);

// A sample value: integers without a decimal point, other doubles in their shortest round-trip form, NaN, +Inf, -Inf.
std::string FormatSampleValue(double value);

}  // namespace diloco
