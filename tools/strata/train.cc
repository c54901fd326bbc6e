// `strata train`: trains GPT-2 through the engine, states spilling to pinned host memory and
// NVMe under the given budgets. See `strata train --help`.
//
// RunTrain reads as the run goes: the flags become a RunConfig (the settings every engine run
// shares, trainer/run_setup.h), RunSetup joins the ranks and opens the device, the model's
// configuration comes from the flags or from --init (read by rank 0 and shared with the
// others), the engine and the trainer are made, and the steps run (train_report.h prints).
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/messages.h"
#include "model/data.h"
#include "model/gpt2.h"
#include "model/run_size.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "strata/atomic_file.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/log.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/interrupt.h"
#include "tools/strata/model_file.h"
#include "tools/strata/report_json.h"
#include "tools/strata/run_flags.h"
#include "tools/strata/run_record.h"
#include "tools/strata/train_report.h"
#include "trainer/run_setup.h"
#include "trainer/trainer.h"

namespace strata::cli {
namespace {

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
  int max_skipped_steps = trainer::TrainOptions{}.max_skipped_steps;
  bool durable = trainer::RunConfig{}.durable;
  // --durable given on the command line (not only its default, or a config file's copy of it).
  bool durable_given = false;
  CLI::Option* durable_opt = nullptr;
  bool print_config = false, allow_schedule_change = false;
  GeometryFlags init_given;  // the geometry flags given with --init (checked against the file)
};

// The flags of a run, for --print-config, the store's record and --resume. Every flag of
// train belongs here unless it only steers this invocation (--config, --resume,
// --print-config, --allow-schedule-change, --rendezvous: a fresh meeting place each time);
// train_cli_test checks that none is left out.
std::vector<Setting> TrainSettings(TrainArgs& a) {
  const OnResume fixed = OnResume::kFixed, free = OnResume::kFree;
  const OnResume schedule = OnResume::kSchedule;
  // Under a cosine schedule the total steps shape the learning rate too.
  const OnResume steps = a.lr_schedule == "cosine" ? schedule : free;
  return {
      {"layers", fixed, &a.layers},
      {"d-model", fixed, &a.d_model},
      {"heads", fixed, &a.heads},
      {"seq-len", fixed, &a.seq_len},
      {"vocab", fixed, &a.vocab},
      {"data", fixed, &a.data, true},
      {"tokenizer", fixed, &a.tokenizer, true},
      {"init", free, &a.init, true},  // read only by a fresh run
      {"batch", fixed, &a.batch},
      {"micro-batches", fixed, &a.run.micro_batches},
      {"micro-batch-order", free, &a.run.micro_batch_order},  // bit-identical either way
      {"seed", fixed, &a.seed},
      {"lr", schedule, &a.lr},
      {"lr-schedule", schedule, &a.lr_schedule},
      {"warmup", schedule, &a.warmup},
      {"weight-decay", fixed, &a.weight_decay},
      {"beta1", fixed, &a.beta1},
      {"beta2", fixed, &a.beta2},
      {"eps", fixed, &a.eps},
      {"grad-clip", fixed, &a.run.grad_clip},
      {"state-dtype", fixed, &a.run.state_dtype},
      {"device", fixed, &a.run.device},
      {"comm-backend", fixed, &a.run.comm_backend},
      {"nvme", fixed, &a.run.nvme, true},
      {"steps", steps, &a.steps},
      {"recompute", free, &a.recompute},  // bit-identical either way
      {"max-skipped-steps", free, &a.max_skipped_steps},
      {"device-mem", free, &a.run.device_mem},
      {"host-mem", free, &a.run.host_mem},
      {"durable", free, &a.durable},
      {"io", free, &a.run.io},
      {"io-config", free, &a.run.io_config, true},
      // The store's stripe: recorded as the run resolved it (flag, --io-config or default).
      {"io-block", fixed, &a.run.io_block},
      {"threads", free, &a.run.cpu_threads},
      {"collective-memory", free, &a.run.collective_memory},  // same results either way
      {"comm-timeout", free, &a.run.comm_timeout},
      {"val-every", free, &a.val_every},
      {"log-every", free, &a.log_every},
      {"save-every", free, &a.save_every},
      {"trace-steps", free, &a.run.trace_steps},
      {"save", free, &a.save, true},
      {"json", free, &a.json, true},
      {"trace", free, &a.run.trace, true},
      {"sample", free, &a.sample},
      {"temperature", free, &a.sampling.temperature},
      {"top-k", free, &a.sampling.top_k},
      {"top-p", free, &a.sampling.top_p},
  };
}

// What every rank must share, as the ranks compare it at start-up: the flags that define the
// run (fixed and schedule ones, and --steps, which decides how many steps' collectives each
// rank issues), with the data as its tokens rather than its path (hosts may mount it
// elsewhere). Left out: paths of each host's own (--nvme, --tokenizer, --init, which rank 0
// alone reads) and --io-block (each host's drives).
std::vector<NamedValue> RankAgreedOptions(const TrainArgs& a, const model::TokenStream& data) {
  TrainArgs copy = a;
  std::vector<NamedValue> out;
  for (const Setting& s : TrainSettings(copy)) {
    const std::string key = s.key;
    if ((s.on_resume == OnResume::kFree && key != "steps") || key == "nvme" || key == "data" ||
        key == "tokenizer" || key == "io-block") {
      continue;
    }
    out.push_back({"--" + key, TomlValue(s)});
  }
  char hash[40];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(
                    XXH3_64bits(data.tokens.data(), data.tokens.size() * sizeof(int32_t))));
  out.push_back(
      {"--data (its tokens)", std::to_string(data.tokens.size()) + " tokens, xxh3 " + hash});
  return out;
}

std::string Decode(const std::vector<int32_t>& toks, int vocab, const model::Tokenizer* tok) {
  if (tok != nullptr) return tok->Decode(toks);
  std::string out;
  for (int32_t t : toks) {
    if (vocab <= 256) {
      out.push_back(static_cast<char>(t));
    } else {
      out += "<" + std::to_string(t) + ">";
    }
  }
  return out;
}

// "rank 2 of 4: " in multi-rank runs, "" otherwise (set once the rank is known).
std::string g_rank_prefix;

int Fail(const Status& s, const std::string& what) {
  std::fprintf(stderr, "strata train: %s%s: %s\n", g_rank_prefix.c_str(), what.c_str(),
               s.ToString().c_str());
  return 1;
}

// Every range that can be checked before anything runs, so that a bad value never leaves
// a store behind (a folder holding one refuses a fresh run). NaN fails every check.
Status CheckTrainFlags(const TrainArgs& a, std::string* what) {
  struct Check {
    const char* flag;
    double value;
    bool ok;
    const char* expected;
  };
  const auto finite_ge0 = [](double v) { return v >= 0 && std::isfinite(v); };
  const Check checks[] = {
      {"--lr", a.lr, finite_ge0(a.lr), "a finite learning rate >= 0"},
      {"--warmup", double(a.warmup), a.warmup >= 0, "a step count >= 0 (0: none)"},
      {"--val-every", double(a.val_every), a.val_every >= 0, "a step count >= 0 (0: off)"},
      {"--sample", double(a.sample), a.sample >= 0, "a token count >= 0 (0: none)"},
      {"--steps", double(a.steps), a.steps >= 0, "a step count >= 0"},
      {"--max-skipped-steps", double(a.max_skipped_steps), a.max_skipped_steps >= 0,
       "a step count >= 0 (0: never stop)"},
      {"--beta1", a.beta1, a.beta1 >= 0 && a.beta1 < 1, "a number in [0, 1)"},
      {"--beta2", a.beta2, a.beta2 >= 0 && a.beta2 < 1, "a number in [0, 1)"},
      {"--eps", a.eps, finite_ge0(a.eps), "a finite number >= 0"},
      {"--weight-decay", a.weight_decay, finite_ge0(a.weight_decay), "a finite number >= 0"},
      {"--grad-clip", a.run.grad_clip, finite_ge0(a.run.grad_clip),
       "a finite gradient norm >= 0 (0: off)"},
      {"--threads", double(a.run.cpu_threads), a.run.cpu_threads >= 0,
       "a thread count >= 0 (0: one per core)"},
      {"--comm-timeout", a.run.comm_timeout, finite_ge0(a.run.comm_timeout),
       "a finite number of seconds >= 0 (0: STRATA_COMM_TIMEOUT)"},
  };
  for (const Check& c : checks) {
    if (c.ok) continue;
    *what = c.flag;
    char value[32];
    std::snprintf(value, sizeof(value), "%g", c.value);
    return Status::InvalidArgument(std::string(c.flag) + " " + value + ": expected " + c.expected);
  }
  *what = "sampling";  // the message names the flag
  STRATA_RETURN_IF_ERROR(a.sampling.Validate());
  if (a.durable && a.durable_given && a.run.nvme.empty() && a.resume.empty()) {
    *what = "--durable";
    return Status::InvalidArgument(
        "--durable commits the state to NVMe every step and needs --nvme folders; add --nvme "
        "DIR, or drop --durable");
  }
  what->clear();
  return Status::OK();
}

// The outputs this rank writes after training can be written: their folders exist and are
// writable (checked before the store is created, not after the last step).
Status CheckOutputs(const TrainArgs& a, const RankInfo& rank, std::string* what) {
  const std::pair<const char*, std::string> outputs[] = {
      {"--save", rank.rank == 0 ? a.save : ""},
      {"--json", rank.rank == 0 ? a.json : ""},
      {"--trace", a.run.trace.empty() ? "" : RankPath(a.run.trace, rank)}};
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    *what = flag;
    STRATA_RETURN_IF_ERROR(CheckOutputPath(path, flag));
  }
  what->clear();
  return Status::OK();
}

// The run's shared settings from the flags.
Status MakeRunConfig(const TrainArgs& a, trainer::RunConfig* config, std::string* what) {
  STRATA_RETURN_IF_ERROR(ApplyRunFlags(a.run, config, what));
  config->resume = a.resume;
  config->durable = a.durable;
  config->beta1 = a.beta1;
  config->beta2 = a.beta2;
  config->eps = a.eps;
  config->weight_decay = a.weight_decay;
  config->batch = a.batch;
  return Status::OK();
}

// Rank 0 alone reports: the others' standard output goes nowhere (errors still reach
// standard error, prefixed with the rank).
void SilenceStdout() {
  std::fflush(stdout);
  const int devnull = ::open("/dev/null", O_WRONLY);
  if (devnull >= 0) {
    ::dup2(devnull, STDOUT_FILENO);
    ::close(devnull);
  }
}

Status CheckSeqLen(const TrainArgs& a, const model::Gpt2Config& cfg, std::string* what) {
  if (a.seq_len <= cfg.max_seq) return Status::OK();
  *what = "--seq-len";
  return Status::InvalidArgument("--seq-len " + std::to_string(a.seq_len) + " exceeds the " +
                                 std::to_string(cfg.max_seq) + " rows of wpe.weight in " + a.init);
}

// Rank 0's reading of --init: the file and the configuration it implies.
Status ReadInit(const TrainArgs& a, std::unique_ptr<model::SafetensorsReader>* init,
                model::Gpt2Config* cfg, std::string* what) {
  auto r = model::SafetensorsReader::Open(a.init);
  if (!r.ok()) {
    *what = "--init";
    return r.status();
  }
  *init = std::make_unique<model::SafetensorsReader>(std::move(r).value());
  auto c = ConfigOfFile(**init, a.init_given);
  if (!c.ok()) {
    *what = "--init " + a.init;
    return c.status();
  }
  *cfg = *c;
  return Status::OK();
}

// The model's configuration: from the flags, or from --init, which rank 0 alone reads and
// shares with the others (a typed message; its failure is shared too, so that no rank
// waits for a configuration that never comes). `init` is set on rank 0 only.
Status ModelConfig(const TrainArgs& a, Communicator* comm, model::Gpt2Config* cfg,
                   std::unique_ptr<model::SafetensorsReader>* init, std::string* what) {
  if (a.init.empty()) {
    cfg->layers = a.layers;
    cfg->d_model = a.d_model;
    cfg->heads = a.heads > 0 ? a.heads : model::DefaultHeads(a.d_model);
    cfg->max_seq = a.seq_len;
    cfg->vocab = a.vocab;
    return Status::OK();
  }
  const char* label = "broadcast --init configuration";
  if (comm != nullptr && comm->rank() != 0) {
    auto shared = ShareFromRoot<model::Gpt2Config>(*comm, 0, std::nullopt, label);
    if (!shared.ok()) {
      *what = "receiving the --init configuration from rank 0";
      return shared.status();
    }
    if (!shared->has_value()) {
      *what = "--init";
      return Status::Aborted("rank 0 could not read --init " + a.init);
    }
    *cfg = **shared;
    return CheckSeqLen(a, *cfg, what);
  }
  Status read = ReadInit(a, init, cfg, what);
  if (comm != nullptr) {
    (void)ShareFromRoot(*comm, 0, read.ok() ? std::optional(*cfg) : std::nullopt, label);
  }
  STRATA_RETURN_IF_ERROR(read);
  return CheckSeqLen(a, *cfg, what);
}

// The trainer's options from the flags, checked against the model and the data.
Status MakeTrainOptions(const TrainArgs& a, const model::Gpt2Config& cfg,
                        const model::TokenStream& data, Communicator* comm,
                        trainer::TrainOptions* to, std::string* what) {
  *what = "model";
  STRATA_RETURN_IF_ERROR(cfg.Validate());
  if (data.vocab > cfg.vocab && a.tok) {
    *what = "--tokenizer";
    return Status::InvalidArgument(
        "--tokenizer " + a.tokenizer + " has " + std::to_string(data.vocab) +
        " tokens but the model's vocabulary is " + std::to_string(cfg.vocab) +
        (a.init.empty() ? "; drop --vocab (the tokenizer's size is the default) or raise it"
                        : "; give the tokenizer --init " + a.init + " was trained with"));
  }
  if (data.vocab > cfg.vocab) {
    *what = "--vocab";
    return Status::InvalidArgument(
        data.description + " holds token ids up to " + std::to_string(data.vocab - 1) +
        " but the model's " + "vocabulary is " + std::to_string(cfg.vocab) + "; raise --vocab");
  }
  if (a.seq_len < 1 || a.batch < 1 || a.steps < 0) {
    *what = "flags";
    return Status::InvalidArgument(
        "--seq-len, --batch and --micro-batches must be >= 1 and "
        "--steps >= 0");
  }
  to->seq_len = a.seq_len;
  to->batch = a.batch;
  to->micro_batches = a.run.micro_batches;
  to->lr = a.lr;
  to->warmup = a.warmup;
  to->steps = a.steps;
  to->recompute = a.recompute;
  to->max_skipped_steps = a.max_skipped_steps;
  to->comm = comm;
  if (a.lr_schedule == "cosine") {
    to->schedule = trainer::LrSchedule::kCosine;
  } else if (a.lr_schedule != "constant") {
    *what = "--lr-schedule";
    return Status::InvalidArgument("--lr-schedule " + a.lr_schedule +
                                   ": expected constant or cosine");
  }
  what->clear();
  return Status::OK();
}

// The run's sizes in overflow-safe arithmetic, against this host, before anything is
// allocated or planned.
Status CheckRunSize(const TrainArgs& a, const model::Gpt2Config& cfg,
                    const trainer::RunSetup& setup, std::string* what) {
  *what = "model size";
  const int rows = a.batch / std::max(1, setup.rank().world_size);
  STRATA_ASSIGN_OR_RETURN(model::RunSize size,
                          model::EstimateRunSize(cfg, rows, a.seq_len, a.recompute));
  return model::CheckRunSize(
      size, {.host_memory_bytes = model::HostMemoryBytes(),
             .cpu_model = setup.device().Kind() != DeviceKind::kCuda,
             .have_nvme = !setup.config().nvme.empty() || !setup.config().resume.empty()});
}

// --save: the weights (collective: every rank reads its shard; rank 0 writes) replace the
// file atomically (model::SaveWeights writes through AtomicFile), so an interrupted or
// killed run leaves the previous file whole.
Status SaveWeightsAtomically(const TrainArgs& a, const trainer::Trainer& trainer,
                             const model::Gpt2Config& cfg, bool lead, int64_t step,
                             std::string* what) {
  *what = "--save";
  STRATA_ASSIGN_OR_RETURN(model::HostWeights w, trainer.Weights());
  if (!lead) return Status::OK();
  STRATA_RETURN_IF_ERROR(
      model::SaveWeights(a.save, trainer.specs(), w, model::GeometryMetadata(cfg)));
  std::printf("# saved the weights of step %lld to %s\n", static_cast<long long>(step),
              a.save.c_str());
  return Status::OK();
}

Status WriteJson(const JsonDestination& out, bool lead, const nlohmann::json& js,
                 std::string* what) {
  if (!out.enabled() || !lead) return Status::OK();
  *what = "--json";
  return out.Write("--json", js.dump(1) + "\n");
}

// After training: --save (rank 0 writes), --sample, --json (rank 0 writes).
Status WriteOutputs(const TrainArgs& a, const JsonDestination& out, const trainer::Trainer& trainer,
                    const model::Gpt2Config& cfg, bool lead, const nlohmann::json& js,
                    std::string* what) {
  if (!a.save.empty()) {
    STRATA_RETURN_IF_ERROR(
        SaveWeightsAtomically(a, trainer, cfg, lead, trainer.next_step() - 1, what));
  }
  if (a.sample > 0) {
    *what = "--sample";
    STRATA_ASSIGN_OR_RETURN(model::HostWeights w, trainer.Weights());
    const std::string prompt = "The ";
    std::vector<int32_t> p(prompt.begin(), prompt.end());
    if (a.tok) {
      STRATA_ASSIGN_OR_RETURN(p, a.tok->Encode(prompt));
    } else if (cfg.vocab < 256) {
      p = {0};
    }
    model::SamplingOptions sampling = a.sampling;
    sampling.seed = a.seed;
    const auto out = model::Generate(cfg, w, p, a.sample, sampling);
    std::printf("sample: %s\n", Decode(out, cfg.vocab, a.tok.get()).c_str());
  }
  return WriteJson(out, lead, js, what);
}

// After SIGINT/SIGTERM: the finished steps' --json, and how to continue.
Status ReportInterrupt(const TrainArgs& a, const JsonDestination& out, const TrainTotals& totals,
                       const trainer::RunSetup& setup, const nlohmann::json& js,
                       std::string* what) {
  const bool lead = setup.rank().rank == 0;
  STRATA_RETURN_IF_ERROR(WriteJson(out, lead, js, what));
  if (!lead) return Status::OK();
  const long long step =
      static_cast<long long>(totals.last_step > 0 ? totals.last_step : totals.resumed_step);
  std::fflush(stdout);
  const std::string folder = !a.run.nvme.empty() ? a.run.nvme.front() : a.resume;
  if (step == 0) {
    std::fprintf(stderr,
                 "strata train: interrupted (%s) before the first step; nothing was committed: "
                 "run the same command again\n",
                 InterruptName(totals.interrupted));
  } else if (folder.empty() || !a.durable) {
    std::fprintf(stderr,
                 "strata train: interrupted (%s) at step %lld; the run cannot be resumed: %s\n",
                 InterruptName(totals.interrupted), step,
                 folder.empty() ? "it had no --nvme folder to commit its state to"
                                : "--no-durable commits no complete state");
  } else {
    std::fprintf(stderr, "strata train: interrupted (%s) at step %lld; resume with: %s\n",
                 InterruptName(totals.interrupted), step, ResumeCommand(folder).c_str());
  }
  return Status::OK();
}

// The run's record in each of its store folders (run_record.h), with the model's geometry
// as the run resolved it (from --init, or the default heads).
Status RecordRun(const TrainArgs& a, const model::Gpt2Config& cfg, const EngineOptions& eo,
                 const RankInfo& rank) {
  TrainArgs resolved = a;
  resolved.run.io_block = std::to_string(eo.nvme_stripe_bytes);
  resolved.layers = cfg.layers;
  resolved.d_model = cfg.d_model;
  resolved.heads = cfg.heads;
  resolved.vocab = cfg.vocab;
  RunIdentity id;
  id.world_size = rank.world_size;
  if (!a.data.empty()) STRATA_RETURN_IF_ERROR(HashDataFile(a.data, &id));
  const std::string text = RunRecordText(TrainSettings(resolved), id);
  for (const std::string& folder : eo.nvme_paths)
    STRATA_RETURN_IF_ERROR(WriteRunRecord(folder, text));
  return Status::OK();
}

Status Train(const TrainArgs& a, int* interrupted, std::string* what) {
  STRATA_RETURN_IF_ERROR(CheckTrainFlags(a, what));
  if (a.save_every < 0 || (a.save_every > 0 && a.save.empty())) {
    *what = "--save-every";
    return Status::InvalidArgument(
        "--save-every " + std::to_string(a.save_every) +
        (a.save_every < 0 ? " must be >= 0" : " needs --save FILE: where to write"));
  }
  InstallInterruptHandlers();
  // With --json -, standard output carries the JSON alone; the report goes to standard error.
  const JsonDestination json_out(a.json);
  trainer::RunConfig config;
  STRATA_RETURN_IF_ERROR(MakeRunConfig(a, &config, what));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<trainer::RunSetup> setup,
                          trainer::RunSetup::Begin(config, what));
  const RankInfo& ri = setup->rank();
  STRATA_RETURN_IF_ERROR(CheckOutputs(a, ri, what));
  if (ri.world_size > 1) {
    g_rank_prefix =
        "rank " + std::to_string(ri.rank) + " of " + std::to_string(ri.world_size) + ": ";
  }
  STRATA_RETURN_IF_ERROR(setup->Start({"strata-train", "/tmp/strata-train-rdzv-"}, what));
  Communicator* const comm = setup->host_comm();  // nullptr: one rank, no collectives
  if (comm != nullptr && ri.rank != 0) SilenceStdout();

  *what = "--data";
  STRATA_ASSIGN_OR_RETURN(model::TokenStream data, LoadDataFile(a.data, a.tok.get()));
  if (comm != nullptr) {
    *what = "comparing the ranks' options";
    STRATA_RETURN_IF_ERROR(CheckSameOnEveryRank(*comm, RankAgreedOptions(a, data), "options"));
  }
  model::Gpt2Config cfg;
  std::unique_ptr<model::SafetensorsReader> init;
  STRATA_RETURN_IF_ERROR(ModelConfig(a, comm, &cfg, &init, what));
  trainer::TrainOptions to;
  STRATA_RETURN_IF_ERROR(MakeTrainOptions(a, cfg, data, comm, &to, what));
  STRATA_RETURN_IF_ERROR(CheckRunSize(a, cfg, *setup, what));
  *what = "--data";
  STRATA_ASSIGN_OR_RETURN(model::Batcher batcher,
                          model::Batcher::Create(&data, a.batch, a.seq_len));

  // The configuration first, then each phase of the start-up as it goes (a large model
  // takes seconds to place and initialise).
  TrainReportInputs report{setup.get(), &cfg,          &to,    &data,     &batcher,
                           nullptr,     a.lr_schedule, a.seed, a.run.nvme};
  report.log_every = a.log_every;
  PrintConfig(report);
  STRATA_ASSIGN_OR_RETURN(EngineOptions eo, setup->MakeEngineOptions(what));
  if (!a.run.io_config.empty() && !eo.nvme_paths.empty()) {
    std::printf("# nvme I/O (--io-config %s): %s\n", a.run.io_config.c_str(),
                IoSettingsText(eo).c_str());
  }
  StartupPhase phase(a.resume.empty() ? "placing the states and creating the engine"
                                      : "opening the store to resume");
  const int rows = a.batch / std::max(1, ri.world_size);
  const bool cpu_model = setup->device().Kind() != DeviceKind::kCuda;
  trainer::MicroBatchOrderInputs order_in{
      .choice = config.micro_batch_order,
      .micro_batches = a.run.micro_batches,
      .saved_activation_bytes = model::SavedActivationBytes(cfg, rows, a.seq_len, a.recompute),
      .model_has_slots = cpu_model,
      .multi_rank = ri.world_size > 1,
      .unlimited_room_bytes = 0};
  if (cpu_model) {
    auto size = model::EstimateRunSize(cfg, rows, a.seq_len, a.recompute);
    const bool nvme = !config.nvme.empty() || !config.resume.empty();
    if (size.ok()) {
      order_in.unlimited_room_bytes = model::HostRoomLeft(
          *size, {.host_memory_bytes = model::HostMemoryBytes(), .have_nvme = nvme});
    }
  }
  auto created = trainer::CreateOrderedEngine(model::Gpt2BlockSpecs(cfg), eo, order_in);
  if (!created.ok()) {
    // The flags that decide what failed: the budgets, or the store being resumed.
    *what = created.status().code() == StatusCode::kOutOfMemory
                ? "budgets (--device-mem, --host-mem, --nvme)"
            : created.status().code() == StatusCode::kNotSupported
                ? "--micro-batch-order"
                : (a.resume.empty() ? "engine" : "--resume " + a.resume);
    return created.status();
  }
  std::unique_ptr<Engine> engine = std::move(created->engine);
  to.micro_batch_order = created->order;
  to.accumulate_on_device = created->accumulate_on_device;
  phase.Done();
  std::printf("# micro-batches: %s\n", created->reason.c_str());
  report.engine = engine.get();
  if (comm != nullptr) {
    // Every rank must resume the same step (each rank's store holds its own shard).
    Status s = AgreeOnResumedStep(*comm, engine->ResumedStep());
    *what = s.code() == StatusCode::kInvalidArgument ? "--resume" : "agreeing on the resumed step";
    STRATA_RETURN_IF_ERROR(s);
  }
  if (engine->ResumedStep() > 0 && a.steps <= engine->ResumedStep()) {
    // --steps counts the resumed steps: a user who meant "this many more" trains nothing.
    LogWarning("--steps " + std::to_string(a.steps) + " counts the resumed steps too, and " +
               a.resume + " already holds step " + std::to_string(engine->ResumedStep()) +
               ": nothing to train; give --steps above " + std::to_string(engine->ResumedStep()) +
               " to train further");
  }
  if (!eo.nvme_paths.empty()) {
    // A fresh run records itself; a resumed one records what it now runs with (the
    // changes --resume applied), so that the next --resume alone continues it.
    *what = "recording the run in its --nvme folders";
    STRATA_RETURN_IF_ERROR(RecordRun(a, cfg, eo, ri));
  }
  trainer::Trainer trainer(engine.get(), &setup->device(), cfg, to, &batcher);
  // A resumed store holds its weights, even at step 0 (the initial commit of a run that
  // failed before its first step completed).
  if (a.resume.empty()) {
    *what = init ? "--init " + a.init : "initialising weights";
    StartupPhase init_phase(init
                                ? "reading the weights of --init " + a.init
                                : "initialising the weights (seed " + std::to_string(a.seed) + ")");
    STRATA_RETURN_IF_ERROR(trainer.InitWeights(init.get(), a.seed));
    init_phase.Done();
  } else if (init) {
    std::printf("# --init %s ignored: resuming from step %lld in %s\n", a.init.c_str(),
                static_cast<long long>(engine->ResumedStep()), a.resume.c_str());
  }

  nlohmann::json js;
  js["config"] = PrintPlacement(report);
  if (!eo.nvme_paths.empty()) {
    js["config"]["nvme_io"] = {
        {"block_bytes", eo.nvme_stripe_bytes},      {"queue_depth", eo.io.queue_depth},
        {"backend", IoBackendKindName(eo.io.kind)}, {"direct", eo.io.direct},
        {"fixed_buffers", eo.io.fixed_buffers},     {"io_config", a.run.io_config}};
  }
  js["placement"] = PlacementJson(engine->Placement());
  js["config"]["micro_batch_order"] = MicroBatchOrderName(created->order);
  js["config"]["micro_batch_order_reason"] = created->reason;
  js["config"]["layer_major_activation_bytes"] = created->activation_bytes;
  js["steps"] = nlohmann::json::array();
  TrainTotals totals;
  AfterStep after_step;
  if (a.save_every > 0) {
    after_step = [&](int64_t step) {
      if (step % a.save_every != 0 || step == to.steps) return Status::OK();  // the last: below
      return SaveWeightsAtomically(a, trainer, cfg, ri.rank == 0, step, what);
    };
  }
  STRATA_RETURN_IF_ERROR(
      RunSteps(trainer, report, a.val_every, after_step, &js["steps"], &totals, what));
  PrintTotals(totals);
  js["totals"] = TotalsJson(totals);
  if (totals.interrupted != 0) {
    *interrupted = totals.interrupted;
    return ReportInterrupt(a, json_out, totals, *setup, js, what);
  }
  return WriteOutputs(a, json_out, trainer, cfg, ri.rank == 0, js, what);
}

int RunTrain(const TrainArgs& a) {
  std::string what;
  int interrupted = 0;
  Status s = Train(a, &interrupted, &what);
  if (!s.ok()) return Fail(s, what);
  return interrupted != 0 ? InterruptExitCode(interrupted) : 0;
}

// The flags as the run will use them: --config applied, then with --resume the record of
// the stored run merged in (run_record.h). With --print-config, prints and sets *done.
Status ResolveFlags(CLI::App* sub, const std::string& config, TrainArgs* a, bool* done) {
  a->durable_given = a->durable_opt->count() > 0;  // before the file adds its own
  if (!config.empty()) STRATA_RETURN_IF_ERROR(ApplyConfigFile(sub, config));
  auto given = [sub](const std::string& key) { return sub->get_option("--" + key)->count() > 0; };
  if (given("layers")) a->init_given.layers = a->layers;
  if (given("d-model")) a->init_given.d_model = a->d_model;
  if (given("heads")) a->init_given.heads = a->heads;
  if (given("vocab")) a->init_given.vocab = a->vocab;
  if (given("io-block") && !a->run.io_block.empty()) {
    // In bytes, as the record keeps it (1M and 1048576 are the same store).
    STRATA_ASSIGN_OR_RETURN(const uint64_t bytes, ParseBytes("--io-block", a->run.io_block));
    a->run.io_block = std::to_string(bytes);
  }
  bool recorded = false;  // the settings came from a stored run's record
  if (!a->resume.empty()) {
    STRATA_ASSIGN_OR_RETURN(const RankInfo rank, RankFromEnvOrSingle());
    const std::string folder = RankPath(a->resume, rank);
    STRATA_ASSIGN_OR_RETURN(std::optional<RunRecord> record, ReadRunRecord(folder));
    if (!record) {
      // (A missing folder is the engine's to report.)
      if (std::filesystem::is_directory(folder)) {
        std::printf(
            "# %s has no record of its run (a store from before strata kept one): the "
            "flags given are used unchecked\n",
            folder.c_str());
      }
    } else {
      // The recorded schedule decides whether --steps may change (it shapes a cosine one).
      for (const auto& [key, inputs] : record->train) {
        if (key == "lr-schedule" && !given(key) && !inputs.empty()) a->lr_schedule = inputs[0];
      }
      std::vector<std::string> applied;
      auto identity = [&](RunIdentity* id) {
        id->world_size = rank.world_size;
        return a->data.empty() ? Status::OK() : HashDataFile(a->data, id);
      };
      STRATA_RETURN_IF_ERROR(MergeRecord(*record, TrainSettings(*a), given, identity,
                                         a->allow_schedule_change, &applied));
      recorded = true;
      for (const std::string& line : applied) {
        std::printf("# resuming %s with %s\n", folder.c_str(), line.c_str());
      }
      // The record's folders are absolute: so is --resume, to be found among them.
      a->resume = AbsolutePath(a->resume);
      for (std::string& f : a->run.nvme) f = AbsolutePath(f);
    }
  }
  if (!a->tokenizer.empty()) {
    auto tok = model::Tokenizer::Load(a->tokenizer);
    if (!tok.ok()) {
      return Status(tok.status().code(), "--tokenizer: " + tok.status().message());
    }
    a->tok = std::make_shared<const model::Tokenizer>(std::move(tok).value());
    // The model's vocabulary is the tokenizer's unless --vocab, --init or the record says.
    if (!given("vocab") && a->init.empty() && !recorded) a->vocab = a->tok->vocab_size();
  }
  if (a->print_config) {
    TrainArgs shown = *a;
    if (shown.heads == 0 && shown.init.empty()) shown.heads = model::DefaultHeads(shown.d_model);
    std::printf(
        "# strata train --print-config: the effective configuration (--config FILE "
        "reads it)\n%s",
        TomlTable("train", TrainSettings(shown)).c_str());
    *done = true;
  }
  return Status::OK();
}

}  // namespace

void AddTrain(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train a GPT-2 model through the engine; parameters and optimizer states live in device "
      "memory, pinned host memory or NVMe under the given budgets");
  auto config = std::make_shared<std::string>();
  AddConfigFlag(sub, config.get());
  sub->add_option("--layers", a->layers, "Transformer layers")->capture_default_str();
  sub->add_option("--d-model", a->d_model, "Channels (embedding width)")->capture_default_str();
  sub->add_option("--heads", a->heads,
                  "Attention heads (must divide --d-model); default: d_model / 64, or 1 when "
                  "d_model is not a multiple of 64; with --init, the n_head the file records");
  sub->add_option("--seq-len", a->seq_len, "Tokens per row (at most wpe's rows with --init)")
      ->capture_default_str();
  sub->add_option("--vocab", a->vocab,
                  "Vocabulary size (256 for byte-level text; with --tokenizer, its size)")
      ->capture_default_str();
  sub->add_option("--data", a->data,
                  "Training data: a text file (byte tokens, or --tokenizer's) or an llm.c "
                  "uint16 token file; default: the built-in generated corpus");
  sub->add_option("--tokenizer", a->tokenizer,
                  "Hugging Face tokenizer.json (GPT-2 byte-level BPE) that encodes a text "
                  "--data and --sample; fixed for the run (give the same to generate and eval)");
  sub->add_option("--val-every", a->val_every,
                  "Every K steps, report the loss on the held-out last 10% of the data (0: off)")
      ->capture_default_str();
  sub->add_option("--log-every", a->log_every,
                  "When standard output is not a terminal, print a step line every N steps "
                  "(and the first and last); 0: every step up to 50 steps, else a round "
                  "interval giving at most 50 lines. A terminal shows a progress bar instead")
      ->capture_default_str();
  sub->add_option("--init", a->init, "Initial weights: Hugging Face GPT-2 .safetensors file");
  sub->add_option("--save", a->save,
                  "Write the trained weights to this .safetensors file (replaced atomically)");
  sub->add_option("--save-every", a->save_every,
                  "With --save: also write the weights every N steps (0: only at the end)")
      ->capture_default_str();
  sub->add_option("--resume", a->resume,
                  "Continue the run whose swap store is in this folder from its last "
                  "committed step, with the settings the store recorded (a flag that would "
                  "train another run is refused; steps, budgets and outputs may change)");
  sub->add_option("--lr", a->lr, "Peak learning rate")->capture_default_str();
  sub->add_option("--lr-schedule", a->lr_schedule, "constant or cosine (to 10% of --lr)")
      ->capture_default_str();
  sub->add_option("--warmup", a->warmup, "Linear warm-up steps")->capture_default_str();
  sub->add_option("--weight-decay", a->weight_decay,
                  "AdamW decoupled weight decay (matrices and embeddings only)")
      ->capture_default_str();
  sub->add_option("--beta1", a->beta1, "Adam beta1")->capture_default_str();
  sub->add_option("--beta2", a->beta2, "Adam beta2")->capture_default_str();
  sub->add_option("--eps", a->eps, "Adam epsilon")->capture_default_str();
  sub->add_option("--batch", a->batch, "Rows per micro-batch")->capture_default_str();
  sub->add_option("--steps", a->steps, "Optimizer steps (total, counting resumed ones)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the initialisation and of --sample")
      ->capture_default_str();
  sub->add_flag("--recompute", a->recompute,
                "Activation checkpointing: keep only each block's input, recompute in backward");
  sub->add_option("--max-skipped-steps", a->max_skipped_steps,
                  "A step whose gradient is not finite (NaN or infinity) updates nothing and is "
                  "skipped with a warning; this many in a row stop the run, its last commit "
                  "intact (0: never stop)")
      ->capture_default_str();
  AddRunFlags(sub, &a->run,
              "Folder for NVMe-resident states (repeatable: striped); {rank} and {local_rank} "
              "are replaced by the rank's numbers (one folder per rank)");
  a->durable_opt = AddSwitch(sub, "durable", &a->durable,
                             "With --nvme: commit a complete state to NVMe every step "
                             "(host-resident states too), so a killed or interrupted run can be "
                             "resumed with --resume");
  sub->add_option("--json", a->json,
                  "Write the configuration, per-step results and totals as JSON to FILE (-: "
                  "standard output, which then carries the JSON alone; the report goes to "
                  "standard error)");
  sub->add_option("--sample", a->sample, "After training, print this many generated tokens")
      ->capture_default_str();
  AddSamplingFlags(*sub, &a->sampling);
  sub->add_flag("--print-config", a->print_config,
                "Print the effective configuration as TOML (a file --config reads) and exit; "
                "with --resume, the stored run's");
  sub->add_flag("--allow-schedule-change", a->allow_schedule_change,
                "With --resume: let --lr, --lr-schedule, --warmup (and --steps under a cosine "
                "schedule) differ from the stored run's");
  sub->callback([a, sub, config, exit_code] {
    bool done = false;
    if (Status s = ResolveFlags(sub, *config, a.get(), &done); !s.ok()) {
      std::fprintf(stderr, "strata train: %s\n", s.ToString().c_str());
      *exit_code = 1;
      return;
    }
    if (done) return;
    *exit_code = RunTrain(*a);
  });
}

}  // namespace strata::cli
