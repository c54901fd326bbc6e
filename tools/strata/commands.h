// The `strata` subcommands. Each Add* function registers one subcommand on `parent`; when
// the user picks it, its callback runs and stores the process exit code in *exit_code.
// CLI11 exceptions stay inside tools/ (the edge); library calls return Status.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::model {
struct SamplingOptions;
}

namespace strata::cli {

// (subcommands are declared here, one line each)
void AddTrain(CLI::App& app, int* exit_code);         // strata train
void AddGenerate(CLI::App& app, int* exit_code);      // strata generate
void AddBenchModel(CLI::App& bench, int* exit_code);  // strata bench model
void AddBenchIo(CLI::App& bench, int* exit_code);     // strata bench io
void AddLaunch(CLI::App& app, int* exit_code);        // strata launch -n N -- COMMAND...
void AddBenchAdam(CLI::App& bench, int* exit_code);   // strata bench adam
void AddBenchStep(CLI::App& bench, int* exit_code);   // strata bench step
void AddEval(CLI::App& app, int* exit_code);          // strata eval
void AddBenchComm(CLI::App& bench, int* exit_code);   // strata bench comm
void AddVerify(CLI::App& app, int* exit_code);        // strata verify DIR
void AddExport(CLI::App& app, int* exit_code);        // strata export DIR

// --temperature, --top-k and --top-p on `sub` (generate, train --sample), stored in *s, which
// must outlive the parse; ranges are checked by CLI11 as the flags are read.
void AddSamplingFlags(CLI::App& sub, model::SamplingOptions* s);

}  // namespace strata::cli
