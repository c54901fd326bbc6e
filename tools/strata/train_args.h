// The arguments of `strata train`: the flags as TrainArgs, their definitions (--help), the
// checks that need nothing else, the table a run records in its store and merges back on
// --resume (run_record.h), what the ranks compare at start-up, and how --config, --resume's
// record and --tokenizer resolve them before the run starts (train.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "comm/messages.h"
#include "model/data.h"
#include "model/gpt2.h"
#include "model/tokenizer.h"
#include "strata/env.h"
#include "strata/status.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/model_file.h"
#include "tools/strata/run_flags.h"
#include "tools/strata/run_record.h"
#include "trainer/run_setup.h"
#include "trainer/trainer.h"

namespace strata::cli {

struct TrainArgs {
  int layers = 4, d_model = 128, seq_len = 64, vocab = 256;
  int heads = 0;  // 0: model::DefaultHeads(d_model), the rule of every subcommand
  std::string data, init, save, resume;
  std::string tokenizer;  // --tokenizer: a Hugging Face tokenizer.json for a text --data
  // --tokenizer as read (by ResolveFlags); null without one.
  std::shared_ptr<const model::Tokenizer> tok;
  int64_t save_every = 0;  // with --save: also every N steps
  int64_t val_every = 0;
  int64_t log_every = 0;  // 0: DefaultLogEvery
  double lr = 1e-3;
  std::string lr_schedule = "constant";
  int64_t warmup = 0;
  // The optimizer's defaults are RunConfig's (shared with `strata bench step`).
  double weight_decay = trainer::RunConfig{}.weight_decay;
  double beta1 = trainer::RunConfig{}.beta1, beta2 = trainer::RunConfig{}.beta2;
  double eps = trainer::RunConfig{}.eps;
  int batch = 8;
  int64_t steps = 100;
  uint64_t seed = 1;
  RunFlags run;  // --device, budgets, --nvme, --grad-clip, ranks, ...
  std::string json;
  int sample = 0;
  model::SamplingOptions sampling;  // of --sample; its seed is --seed
  bool recompute = false;
  CLI::Option* recompute_option = nullptr;
  bool recompute_given = false;  // --recompute or --no-recompute on the command line
  int max_skipped_steps = trainer::TrainOptions{}.max_skipped_steps;
  bool durable = trainer::RunConfig{}.durable;
  // --durable given on the command line (not only its default, or a config file's copy of it).
  bool durable_given = false;
  CLI::Option* durable_opt = nullptr;
  bool print_config = false, allow_schedule_change = false;
  // With --resume: --state-dtype may differ from the record's; the moments are converted
  // (EngineOptions::convert_state_format).
  bool allow_state_dtype_change = false;
  GeometryFlags init_given;
  // The run's identity (run_record.h): the record's with --resume (set by ResolveFlags),
  // else made when the run starts.
  std::string run_id;  // the geometry flags given with --init (checked against the file)
  // The CUDA kernels the run uses (train_kernels.h; "" on the host device), recorded; and,
  // with --resume, those its record names.
  std::string cuda_kernels, recorded_cuda_kernels;
  // With --resume: the ranks whose stores hold the state (store_layout.h), and its step;
  // another count than this run's re-shards (EngineOptions::reshard_from).
  int stored_world_size = 0;
  uint64_t stored_step = 0;
  // With --resume: the --state-dtype the stored run recorded (its moments' format).
  std::string stored_state_dtype;
};

// Defines every flag of train on `sub` (bound to *a), except --config.
void AddTrainFlags(CLI::App* sub, TrainArgs* a);

// The flags of a run, for --print-config, the store's record and --resume. Every flag of
// train belongs here unless it only steers this invocation (--config, --resume,
// --print-config, --allow-schedule-change, --rendezvous: a fresh meeting place each time);
// train_cli_test checks that none is left out.
std::vector<Setting> TrainSettings(TrainArgs& a);

// What every rank must share, as the ranks compare it at start-up: the flags that define the
// run (fixed and schedule ones, and --steps, which decides how many steps' collectives each
// rank issues), with the data as its tokens rather than its path (hosts may mount it
// elsewhere). Left out: paths of each host's own (--nvme, --tokenizer, --init, which rank 0
// alone reads) and --io-block (each host's drives).
std::vector<NamedValue> RankAgreedOptions(const TrainArgs& a, const model::TokenStream& data);

// Every range that can be checked before anything runs, so that a bad value never leaves
// a store behind (a folder holding one refuses a fresh run). NaN fails every check.
Status CheckTrainFlags(const TrainArgs& a, std::string* what);

// The outputs this rank writes after training can be written: their folders exist and are
// writable (checked before the store is created, not after the last step).
Status CheckOutputs(const TrainArgs& a, const RankInfo& rank, std::string* what);

// Whether this run converts the stored Adam moments to another format: --resume with
// --allow-state-dtype-change and a --state-dtype whose format (fp32, bf16, int8; bf16-rne is
// bf16's) is not the recorded one.
bool ConvertsMoments(const TrainArgs& a);

// The flags as the run will use them: --config applied, then with --resume the record of
// the stored run merged in (run_record.h). With --print-config, prints and sets *done.
Status ResolveFlags(CLI::App* sub, const std::string& config, TrainArgs* a, bool* done);

}  // namespace strata::cli
