// --config FILE: flags from a TOML file, for every subcommand but `launch` and `env`. CLI11 2.1
// reads a config file only for the top-level app, so each subcommand applies its own after parsing.
//
// The format: `key = value` lines, keys being flag names without the leading dashes
// (d-model = 128; an underscore stands for a dash). Lines before any section belong to the
// subcommand that reads the file; a [section] names a subcommand ([train], [generate],
// [bench.step]) and holds that subcommand's flags, so one file can serve a whole workflow.
// A section that is not a subcommand, or a key that is not a flag of its section's
// subcommand, is an error naming it. The command line wins over the file.
//
// Internal to the CLI. Nothing here prints.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "strata/status.h"

namespace strata::cli {

// Registers --config on `sub`, storing the file name in *path (which must outlive the parse).
CLI::Option* AddConfigFlag(CLI::App* sub, std::string* path);

// Registers --config on `sub` and sets its callback: the file (when given) is applied, then
// `run` gives the exit code; a --config error is printed as "strata <command>: ..." and
// ends with exit code 1.
void SetCallbackWithConfig(CLI::App* sub, std::function<int()> run, int* exit_code);

// Applies the file `path` to `sub` (already parsed from the command line): each key of the
// sections that are `sub` sets its flag unless the command line did. InvalidArgument naming
// the file and the section or key that is wrong, or CLI11's message for a bad value.
Status ApplyConfigFile(CLI::App* sub, const std::string& path);

}  // namespace strata::cli
