// What `strata train` prints and writes: the start-up report (model, data, batch, device,
// ranks, placement, predicted bound), one line per step (a progress bar on a terminal), the
// totals (bytes per edge, busy time per resource) and the --json document. tools/strata/
// train.cc sets the run up and calls these in order.
//
// Internal to the CLI. Everything goes to standard output (other ranks' standard output is
// silenced by train.cc); errors are returned with the flag or step that failed in *what.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/data.h"
#include "model/gpt2.h"
#include "strata/engine.h"
#include "strata/status.h"
#include "trainer/run_setup.h"
#include "trainer/trainer.h"

namespace strata::cli {

// The settings of a training run that the report shows (the flags after resolution).
struct TrainReportInputs {
  const trainer::RunSetup* setup = nullptr;
  const model::Gpt2Config* model = nullptr;
  const trainer::TrainOptions* train = nullptr;
  const model::TokenStream* data = nullptr;
  const model::Batcher* batcher = nullptr;
  const Engine* engine = nullptr;
  std::string lr_schedule;  // as given: constant or cosine
  uint64_t seed = 0;
  std::vector<std::string> nvme;  // as given (with {rank})
};

// Prints the start-up report ("# " lines) and returns the --json document's "config".
nlohmann::json PrintStartup(const TrainReportInputs& in);

// Sums over the steps this run took.
struct TrainTotals {
  int64_t steps = 0;
  double seconds = 0;
  EdgeBytes bytes;
  double busy[kNumResources] = {};
  std::vector<double> losses;
};

// Runs the steps from trainer.next_step() to the last, printing one line each (validation
// every `val_every` steps when > 0) and appending them to `steps_json`. Errors: the step's
// or validation's, with *what "step N" or "validation".
Status RunSteps(trainer::Trainer& trainer, const TrainReportInputs& in, int64_t val_every,
                nlohmann::json* steps_json, TrainTotals* totals, std::string* what);

// Prints the totals: time per step, the loss trend, bytes per edge, busy time per resource.
void PrintTotals(const TrainTotals& totals);

}  // namespace strata::cli
