// ParseFlags: CLI11's parse for the project's binaries, with their exit codes. A flag that is wrong (unknown, missing
// its value, a value out of its set) is one line, "<binary>: error: <CLI11's words>; --help lists the flags", and
// exit code 2, the code every binary gives bad input (and systemd's RestartPreventExitStatus=2 knows), instead of
// CLI11's two lines and 105-109. --help prints the help and exits 0, as before. Header-only; stateless.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "config/config_field.h"

namespace diloco {

// A number flag that must be > 0 ("--interval: must be a number > 0, got 0"; CLI11's PositiveNumber prints the
// range up to DBL_MAX in full).
inline CLI::Validator PositiveSeconds() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(value, v) && v > 0 && v < 1e9) return "";
        return "must be a number of seconds > 0, got " + value;
      },
      "SECONDS > 0");
}

// An address flag: HOST:PORT with a port in 1..65535 ("--coordinator: must be HOST:PORT, got 127.0.0.1"). Without
// it gRPC dials port 443 (or 0) and the caller waits for a reason it never prints.
// The config's own HOST:PORT rule (coordinator.listen), less port 0, which a dialled address cannot have.
inline CLI::Validator HostPortFlag() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const bool port_zero = value.find_first_not_of('0', value.rfind(':') + 1) == std::string::npos;
        if (HostPort().allows(value) && !port_zero) return "";
        return "must be HOST:PORT with a port in 1..65535, got " + value;
      },
      "HOST:PORT");
}

// -1 when argv parsed (go on); else the exit code main returns.
inline int ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all: the help text
    std::cerr << std::filesystem::path(argc > 0 ? argv[0] : "diloco").filename().string() << ": error: " << e.what()
              << "; --help lists the flags" << std::endl;
    return 2;
  }
}

}  // namespace diloco
