// What `strata train` prints and writes: the start-up report (model, data, batch, device,
// ranks, placement, predicted bound), one line per step (a progress bar on a terminal), the
// totals (bytes per edge, busy time per resource) and the --json document. tools/strata/
// train.cc sets the run up and calls these in order.
//
// Internal to the CLI. Everything goes to standard output (other ranks' standard output is
// silenced by train.cc); errors are returned with the flag or step that failed in *what.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/data.h"
#include "model/gpt2.h"
#include "strata/engine.h"
#include "strata/log.h"
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
  Engine* engine = nullptr;  // RunSteps flushes it and takes its committed statistics
  std::string lr_schedule;   // as given: constant or cosine
  uint64_t seed = 0;
  std::vector<std::string> nvme;  // as given (with {rank})
  // Not on a terminal: a step line every this many steps (and the run's first and last);
  // 0 = LogEvery's default. On a terminal a progress bar shows every step.
  int64_t log_every = 0;
};

// The default step-line interval: every step up to 50 steps, else the round number (1, 2 or 5
// times a power of ten) that gives at most 50 lines.
int64_t DefaultLogEvery(int64_t steps);

// The start-up report, in two parts: the configuration ("# " lines: model, data, batch,
// device), printed before the engine exists (in.engine may be null), then, once the engine
// and the weights are ready, the ranks, placement and predicted bound, returning the --json
// document's "config".
void PrintConfig(const TrainReportInputs& in);
nlohmann::json PrintPlacement(const TrainReportInputs& in);

// One phase of the start-up: "# <what> ..." when made, " done (1.2 s)" on Done, so a long
// start-up shows where it is. A warning logged meanwhile (a tmpfs folder, io_uring refused)
// ends the open line first, so that it starts a line of its own; the phase then ends with
// "# <what>: done (1.2 s)". While it lives it is the log's sink (strata/log.h), passing every
// message on to the sink it replaced; one phase at a time, on the main thread.
class StartupPhase {
 public:
  explicit StartupPhase(const std::string& what);
  ~StartupPhase();  // not Done: ends the line (" failed"), so the error starts a line of its own
  StartupPhase(const StartupPhase&) = delete;
  StartupPhase& operator=(const StartupPhase&) = delete;
  void Done();

 private:
  void End(const std::string& how);  // puts the log's sink back, then ends the phase's line

  std::string what_;
  std::chrono::steady_clock::time_point start_;
  bool done_ = false;
  bool line_open_ = true;  // "# <what> ..." not ended yet; the sink's (under the log's mutex)
  std::function<void(LogLevel, std::string_view)> previous_sink_;
};

// Sums over the steps this run took.
struct TrainTotals {
  int64_t steps = 0;
  int64_t first_step = 0, last_step = 0;  // the steps this run took (a resumed run: k+1..n)
  int64_t resumed_step = 0;               // the committed step it continued from; 0: fresh
  int interrupted = 0;                    // the signal that stopped the run early, or 0
  double seconds = 0;
  EdgeBytes bytes;
  double busy[kNumResources] = {};
  double stall_seconds = 0, tail_seconds = 0, bound_seconds = 0;
  int64_t skipped_steps = 0;  // steps whose gradient was not finite (nothing updated)
  int64_t redone_blocks = 0;
  int64_t redone_steps = 0;  // steps whose speculative updates were redone or undone
  double redo_seconds = 0;   // EndStep's time on them (part of tail_seconds)
  int64_t speculative_steps = 0;
  std::vector<double> losses;
  // Model FLOPs (Gpt2TrainFlopsPerToken x the tokens of the steps) and the device time of the
  // model's kernels as the backend measured it (0 where it does not: the CPU model).
  double model_flops = 0;
  double compute_seconds = 0;
};

// What runs after each step (between steps: the engine is idle), e.g. --save-every.
using AfterStep = std::function<Status(int64_t step)>;

// Runs the steps from trainer.next_step() to the last, printing one line each (validation
// every `val_every` steps when > 0) and appending them to `steps_json`, then flushes the
// engine (the last step's deferred updates run and it commits). A step is reported when its
// statistics are final, at its commit (Engine::TakeCommittedStats): with pipelined updates
// one step later, the last after the flush. Stops early, after the step in progress, once
// SIGINT or SIGTERM arrived (on any rank: the ranks agree after every step), with
// totals->interrupted set. Errors: the step's, validation's, after_step's or the flush's,
// with *what "step N", "validation", after_step's or "committing the last step".
Status RunSteps(trainer::Trainer& trainer, const TrainReportInputs& in, int64_t val_every,
                const AfterStep& after_step, nlohmann::json* steps_json, TrainTotals* totals,
                std::string* what);

// Prints the totals: time per step, the loss trend, bytes per edge, busy time per resource,
// and where the step time went beyond compute (stall, serial tail, redone updates).
void PrintTotals(const TrainTotals& totals);
// The totals as the --json document's "totals".
nlohmann::json TotalsJson(const TrainTotals& totals);

}  // namespace strata::cli
