// `strata train`: trains GPT-2 through the engine, states spilling to pinned host memory and
// NVMe under the given budgets. See `strata train --help`.
//
// RunTrain reads as the run goes: the flags become a RunConfig (the settings every engine run
// shares, trainer/run_setup.h), RunSetup joins the ranks and opens the device, the model's
// configuration comes from the flags or from --init (read by rank 0 and shared with the
// others), the engine and the trainer are made, and the steps run (train_report.h prints).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/messages.h"
#include "model/data.h"
#include "model/gemm_profile.h"
#include "model/gpt2.h"
#include "model/gpt2_backend.h"
#include "model/run_size.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "strata/atomic_file.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/kernel_record.h"
#include "strata/log.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/interrupt.h"
#include "tools/strata/model_file.h"
#include "tools/strata/report_json.h"
#include "tools/strata/run_flags.h"
#include "tools/strata/run_record.h"
#include "tools/strata/store_layout.h"
#include "tools/strata/train_args.h"
#include "tools/strata/train_kernels.h"
#include "tools/strata/train_report.h"
#include "trainer/run_setup.h"
#include "trainer/trainer.h"

namespace strata::cli {
namespace {

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

// The run's shared settings from the flags.
Status MakeRunConfig(const TrainArgs& a, trainer::RunConfig* config, std::string* what) {
  STRATA_RETURN_IF_ERROR(ApplyRunFlags(a.run, config, what));
  config->resume = a.resume;
  config->convert_state_format = ConvertsMoments(a);
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

// What --micro-batch-order auto weighs for this run (trainer/micro_batch_order.h). On the
// host device, where layer-major may turn --recompute on, rank 0 times one block's forward
// GEMMs and shares the prediction, so that every rank picks the same order.
Result<trainer::MicroBatchOrderInputs> OrderInputs(const TrainArgs& a,
                                                   const trainer::RunConfig& config,
                                                   const model::Gpt2Config& cfg,
                                                   trainer::RunSetup& setup, int rows,
                                                   std::string* what) {
  const bool cpu_model = setup.device().Kind() != DeviceKind::kCuda;
  trainer::MicroBatchOrderInputs order_in{
      .choice = config.micro_batch_order,
      .micro_batches = a.run.micro_batches,
      .saved_activation_bytes = model::SavedActivationBytes(cfg, rows, a.seq_len, a.recompute),
      .recompute = a.recompute,
      .recompute_auto = !a.recompute_given,
      .saved_activation_bytes_recompute = model::SavedActivationBytes(cfg, rows, a.seq_len, true),
      .offload = config.offload_activations,
      .offload_shape = model::OffloadedActivations(
          cfg, rows, a.seq_len, model::ResidualValueBytes(setup.device().Kind())),
      .multi_rank = setup.rank().world_size > 1,
      .unlimited_room_bytes = 0,
      .recompute_seconds = std::nullopt};
  if (cpu_model) {
    auto size = model::EstimateRunSize(cfg, rows, a.seq_len, a.recompute);
    const bool nvme = !config.nvme.empty() || !config.resume.empty();
    if (size.ok()) {
      order_in.unlimited_room_bytes = model::HostRoomLeft(
          *size, {.host_memory_bytes = model::HostMemoryBytes(), .have_nvme = nvme});
    }
  } else {
    // The GPU's memory not in use yet, less what the engine keeps there without a budget
    // (every block's bf16 parameters and fp32 gradient buffers at most: 6 bytes a parameter):
    // layer-major's extra activations must fit in the rest.
    const DeviceMemoryStats mem = setup.device().MemoryStats();
    const uint64_t free = mem.budget_bytes - std::min(mem.budget_bytes, mem.in_use_bytes);
    const uint64_t engine = 6 * uint64_t(model::Gpt2NumParams(cfg));
    order_in.unlimited_room_bytes =
        std::max<uint64_t>(1, free - std::min(free, engine));  // 0: "unknown"
  }
  // The cases trainer::CreateOrderedEngine weighs (a forced order or offload is not).
  const bool weigh = cpu_model && a.run.micro_batches > 1 && !a.recompute_given &&
                     config.micro_batch_order == trainer::MicroBatchOrderChoice::kAuto &&
                     config.offload_activations != trainer::OffloadActivations::kOn;
  if (!weigh) return order_in;
  std::optional<double> block_s;
  Communicator* comm = setup.host_comm();
  if (comm == nullptr || setup.rank().rank == 0) {
    StartupPhase phase("timing one block's forward GEMMs to weigh --recompute for layer-major");
    block_s = model::GemmRunner(model::BlockForwardGemms(cfg, rows, a.seq_len)).TimedRun(5);
    phase.Done();
  }
  if (comm != nullptr) {
    *what = "sharing the recompute's predicted time";
    STRATA_ASSIGN_OR_RETURN(block_s, ShareFromRoot(*comm, 0, block_s, "train: recompute time"));
  }
  if (block_s) {
    order_in.recompute_seconds =
        trainer::RecomputeSeconds(*block_s, cfg.layers, a.run.micro_batches);
  }
  return order_in;
}

// The engine in the order --micro-batch-order chooses, with the trainer options that follow
// from the choice; prints the choice (and, with offloaded activations, the most
// micro-batches the budgets admit).
Result<trainer::OrderedEngine> CreateEngine(const TrainArgs& a, const trainer::RunConfig& config,
                                            const model::Gpt2Config& cfg, trainer::RunSetup& setup,
                                            const EngineOptions& eo, trainer::TrainOptions* to,
                                            std::string* what) {
  const int rows = a.batch / std::max(1, setup.rank().world_size);
  STRATA_ASSIGN_OR_RETURN(const trainer::MicroBatchOrderInputs order_in,
                          OrderInputs(a, config, cfg, setup, rows, what));
  StartupPhase phase(a.resume.empty() ? "placing the states and creating the engine"
                                      : "opening the store to resume");
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
  to->micro_batch_order = created->order;
  to->grad_dtype = eo.grad_dtype;
  to->accumulate_on_device = created->accumulate_on_device;
  to->activation_slots = created->activation_slots;
  to->recompute = created->recompute;
  phase.Done();
  std::printf("# micro-batches: %s\n", created->reason.c_str());
  const trainer::MicroBatchCap& cap = created->max_micro_batches;
  if (!cap.bound.empty()) std::printf("# micro-batches: %s\n", cap.ToString().c_str());
  return created;
}

// --json's start: the configuration and placement (PrintPlacement prints them), the NVMe
// I/O settings and the micro-batch order chosen.
nlohmann::json StartJson(const TrainArgs& a, const TrainReportInputs& report,
                         const EngineOptions& eo, const trainer::OrderedEngine& created) {
  nlohmann::json js;
  js["config"] = PrintPlacement(report);
  if (!eo.nvme_paths.empty()) {
    js["config"]["nvme_io"] = {
        {"block_bytes", eo.nvme_stripe_bytes},      {"queue_depth", eo.io.queue_depth},
        {"backend", IoBackendKindName(eo.io.kind)}, {"direct", eo.io.direct},
        {"fixed_buffers", eo.io.fixed_buffers},     {"io_config", a.run.io_config}};
  }
  js["placement"] = PlacementJson(report.engine->Placement());
  if (eo.reshard_from.world_size > 0) {
    // What the placement report says was re-sharded: every block's states, at this step.
    js["config"]["resharded"] = {{"from_ranks", eo.reshard_from.world_size},
                                 {"to_ranks", report.setup->rank().world_size},
                                 {"step", a.stored_step},
                                 {"blocks", report.engine->Layout().size()}};
  }
  js["config"]["micro_batch_order"] = MicroBatchOrderName(created.order);
  js["config"]["micro_batch_order_reason"] = created.reason;
  js["config"]["layer_major_activation_bytes"] = created.activation_bytes;
  js["config"]["activation_slots"] = created.activation_slots;
  js["config"]["offloaded_activations"] = {
      {"d2h_bytes_per_step", created.offloaded_d2h_bytes},
      {"h2d_bytes_per_step", created.offloaded_h2d_bytes},
      {"batch_major_extra_bytes_per_step", created.batch_major_extra_bytes}};
  // With offloaded activations: the most micro-batches the budgets admit (null: unbounded,
  // or not offloaded) and which budget bounds it (host, nvme, unbounded; "" not offloaded).
  const trainer::MicroBatchCap& cap = created.max_micro_batches;
  js["config"]["max_micro_batches"] =
      cap.max > 0 ? nlohmann::json(cap.max) : nlohmann::json(nullptr);
  js["config"]["max_micro_batches_bound"] = cap.bound;
  return js;
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

// A run that fails after it ran steps still writes its --json, as an interrupted one does:
// the steps it ran, their totals and the error (the line the run ends with). Returns
// `failed`; `what` keeps naming what failed.
Status FailAfterSteps(const JsonDestination& out, bool lead, const TrainTotals& totals,
                      const Status& failed, nlohmann::json* js, const std::string& what) {
  if (totals.steps == 0) return failed;
  (*js)["totals"] = TotalsJson(totals);
  (*js)["error"] = g_rank_prefix + what + ": " + failed.ToString();
  std::string json_what;
  if (Status s = WriteJson(out, lead, *js, &json_what); !s.ok()) {
    LogWarning("--json: " + s.ToString());
  }
  return failed;
}

// After training: --save (rank 0 writes), --sample.
Status WriteOutputs(const TrainArgs& a, const trainer::Trainer& trainer,
                    const model::Gpt2Config& cfg, bool lead, std::string* what) {
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
  return Status::OK();
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
    std::fprintf(stderr, "strata train: interrupted (%s) at step %lld; %s\n",
                 InterruptName(totals.interrupted), step, ResumeHint(folder).c_str());
  }
  return Status::OK();
}

// The run's record in each of its store folders (run_record.h), with the model's geometry
// as the run resolved it (from --init, or the default heads). With `conversion`: the moments'
// format the store holds, and the one the commits after the resumed step will hold.
Status RecordRun(const TrainArgs& a, const model::Gpt2Config& cfg, const EngineOptions& eo,
                 const RankInfo& rank, std::optional<StateConversion> conversion) {
  TrainArgs resolved = a;
  if (conversion) resolved.run.state_dtype = a.stored_state_dtype;
  resolved.run.io_block = std::to_string(eo.nvme_stripe_bytes);
  resolved.layers = cfg.layers;
  resolved.d_model = cfg.d_model;
  resolved.heads = cfg.heads;
  resolved.vocab = cfg.vocab;
  RunIdentity id;
  id.run_id = a.run_id;
  id.rank = rank.rank;
  id.world_size = rank.world_size;
  id.cuda_kernels = a.cuda_kernels;
  if (!a.data.empty()) {
    STRATA_ASSIGN_OR_RETURN(id.data, HashFile("--data", a.data));
  }
  if (!a.tokenizer.empty()) {
    STRATA_ASSIGN_OR_RETURN(id.tokenizer, HashFile("--tokenizer", a.tokenizer));
  }
  const std::string text = RunRecordText(TrainSettings(resolved), id, conversion);
  for (const std::string& folder : eo.nvme_paths)
    STRATA_RETURN_IF_ERROR(WriteRunRecord(folder, text));
  return Status::OK();
}

// A fresh run records itself; a resumed one records what it now runs with (the changes
// --resume applied), so that the next --resume alone continues it. Moments converted on this
// resume (ConvertsMoments) are recorded before the first step as a conversion (run_record.h,
// StateConversion): the stored format up to the resumed step, the new one after it. So the
// record matches the store whenever a kill comes: before the first converted commit, or
// between it and the plain record that replaces the conversion after it.
class RunRecorder {
 public:
  RunRecorder(const TrainArgs& a, const model::Gpt2Config& cfg, const EngineOptions& eo,
              const RankInfo& rank, int64_t resumed_step)
      : a_(a), cfg_(cfg), eo_(eo), rank_(rank), resumed_step_(resumed_step) {}

  // Before the first step.
  Status Start() {
    if (done_) return Status::OK();
    if (!converts_) return Record();
    return RecordRun(a_, cfg_, eo_, rank_,
                     StateConversion{a_.run.state_dtype, uint64_t(resumed_step_)});
  }
  // After a step, and after the last commit: the plain record once a commit holds the
  // converted moments.
  Status AfterCommit(std::string* what) {
    if (done_) return Status::OK();
    Result<std::optional<uint64_t>> step = PeekCommittedStep(eo_.nvme_paths[0]);
    if (!step.ok() || !*step || **step <= uint64_t(resumed_step_)) return Status::OK();
    *what = "recording the converted moments' format in the --nvme folders";
    return Record();
  }
  // After the steps, which ended with `ran`: the last commit (Flush) may be the first, and a
  // run that failed after one records it too. `ran`, else the recording's failure.
  Status Finish(Status ran, std::string* what) {
    std::string recording;
    Status recorded = AfterCommit(&recording);
    if (!ran.ok() || recorded.ok()) return ran;
    *what = recording;
    return recorded;
  }

 private:
  Status Record() {
    done_ = true;
    return RecordRun(a_, cfg_, eo_, rank_, std::nullopt);
  }
  const TrainArgs& a_;
  const model::Gpt2Config& cfg_;
  const EngineOptions& eo_;
  const RankInfo& rank_;
  const int64_t resumed_step_;
  const bool converts_ = ConvertsMoments(a_);
  bool done_ = eo_.nvme_paths.empty();  // no store, no record
};

// A fresh run's identity: made by rank 0 and shared, so that every rank's store and record
// name the same run. A resumed run has its record's (ResolveFlags).
Status MakeRunId(Communicator* comm, TrainArgs* a, std::string* what) {
  if (!a->resume.empty()) return Status::OK();
  struct RunIdMessage {
    char hex[33];
  };
  RunIdMessage mine{};
  const std::string id = NewRunId();
  std::snprintf(mine.hex, sizeof mine.hex, "%s", id.c_str());
  if (comm != nullptr) {
    *what = "sharing the run identity";
    STRATA_ASSIGN_OR_RETURN(std::optional<RunIdMessage> shared,
                            ShareFromRoot(*comm, 0, std::optional(mine), "share the run id"));
    if (shared) mine = *shared;
  }
  a->run_id = std::string(mine.hex, strnlen(mine.hex, sizeof mine.hex - 1));
  return Status::OK();
}

// The CUDA kernel variants this run uses (STRATA_CUDA_KERNELS, or what a resumed run
// recorded), printed, set for the CUDA model's ops and kept for the run record.
// --resume of a state that another number of ranks holds: where each old rank's store is,
// for the engine to read this rank's new shards from (EngineOptions::reshard_from). Else,
// a store whose re-sharding's first commit is to be rolled forward keeps its old identity
// until then (EngineOptions::previous_run_id).
void PlanResharding(const TrainArgs& a, const RankInfo& ri, EngineOptions* eo) {
  if (a.resume.empty() || a.stored_world_size == 0 || eo->nvme_paths.empty()) return;
  if (a.stored_world_size == ri.world_size) {
    eo->previous_run_id = PreviousStoreRunId(eo->nvme_paths[0], eo->run_id);
    return;
  }
  const int n = a.stored_world_size;
  eo->reshard_from.world_size = n;
  for (int q = 0; q < n; ++q) {
    const RankInfo old = StoredRank(ri, q);
    std::vector<std::string> folders;
    for (const std::string& f : a.run.nvme) folders.push_back(RankPath(f, old));
    eo->reshard_from.nvme_paths.push_back(std::move(folders));
    eo->reshard_from.run_ids.push_back(StoreRunId(a.run_id, q, n));
  }
  if (ri.rank == 0) {
    std::printf(
        "# re-sharding: step %llu was written by %d rank(s); each of the %d ranks reads its "
        "shards of every block from their stores (checksums verified) and commits them as step "
        "%llu of the %d-rank layout (until then the %d-rank stores stay resumable)\n",
        static_cast<unsigned long long>(a.stored_step), n, ri.world_size,
        static_cast<unsigned long long>(a.stored_step), ri.world_size, n);
  }
}

Status SelectCudaKernels(TrainArgs* a, std::string* what) {
  *what = "STRATA_CUDA_KERNELS";
  const char* env = std::getenv("STRATA_CUDA_KERNELS");
  STRATA_ASSIGN_OR_RETURN(
      RunKernels kernels,
      ChooseRunKernels(env != nullptr ? env : "", !a->resume.empty(), a->recorded_cuda_kernels));
  for (const std::string& line : kernels.lines) std::printf("# %s\n", line.c_str());
  SetRunKernelSpec(kernels.spec);  // what the CUDA model's ops run (and the record names)
  a->cuda_kernels = kernels.spec;
  return Status::OK();
}

// The --nvme folders this run made, and their I/O settings when --io-config gave them.
void PrintStoreFolders(const TrainArgs& a, const EngineOptions& eo,
                       const std::vector<std::string>& made) {
  for (const std::string& folder : made) {
    std::printf("# --nvme %s did not exist: made it (check the path if that is a surprise)\n",
                folder.c_str());
  }
  if (!a.run.io_config.empty() && !eo.nvme_paths.empty()) {
    std::printf("# nvme I/O (--io-config %s): %s\n", a.run.io_config.c_str(),
                IoSettingsText(eo).c_str());
  }
}

Status Train(TrainArgs a, int* interrupted, std::string* what) {
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
  STRATA_RETURN_IF_ERROR(MakeRunId(comm, &a, what));

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
  if (setup->device().Kind() == DeviceKind::kCuda) {
    STRATA_RETURN_IF_ERROR(SelectCudaKernels(&a, what));
  }
  std::vector<std::string> made;
  STRATA_ASSIGN_OR_RETURN(EngineOptions eo, setup->MakeEngineOptions(what, &made));
  eo.run_id = StoreRunId(a.run_id, ri.rank, ri.world_size);
  PlanResharding(a, ri, &eo);
  PrintStoreFolders(a, eo, made);
  STRATA_ASSIGN_OR_RETURN(trainer::OrderedEngine created,
                          CreateEngine(a, config, cfg, *setup, eo, &to, what));
  std::unique_ptr<Engine> engine = std::move(created.engine);
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
  RunRecorder recorder{a, cfg, eo, ri, engine->ResumedStep()};
  *what = "recording the run in its --nvme folders";
  STRATA_RETURN_IF_ERROR(recorder.Start());
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

  nlohmann::json js = StartJson(a, report, eo, created);
  js["steps"] = nlohmann::json::array();
  TrainTotals totals;
  AfterStep after_step = [&](int64_t step) {
    STRATA_RETURN_IF_ERROR(recorder.AfterCommit(what));
    if (a.save_every <= 0 || step % a.save_every != 0 || step == to.steps) {
      return Status::OK();  // the last: below
    }
    return SaveWeightsAtomically(a, trainer, cfg, ri.rank == 0, step, what);
  };
  const bool lead = ri.rank == 0;
  // Flushes the engine at the end (the last step commits), also after Ctrl-C.
  Status ran = RunSteps(trainer, report, a.val_every, after_step, &js["steps"], &totals, what);
  ran = recorder.Finish(std::move(ran), what);
  if (!ran.ok()) return FailAfterSteps(json_out, lead, totals, ran, &js, *what);
  PrintTotals(totals);
  js["totals"] = TotalsJson(totals);
  if (totals.interrupted != 0) {
    *interrupted = totals.interrupted;
    return ReportInterrupt(a, json_out, totals, *setup, js, what);
  }
  Status wrote = WriteOutputs(a, trainer, cfg, lead, what);
  if (!wrote.ok()) return FailAfterSteps(json_out, lead, totals, wrote, &js, *what);
  return WriteJson(json_out, lead, js, what);
}

int RunTrain(const TrainArgs& a) {
  std::string what;
  int interrupted = 0;
  Status s = Train(a, &interrupted, &what);
  if (!s.ok()) return Fail(s, what);
  return interrupted != 0 ? InterruptExitCode(interrupted) : 0;
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
  AddTrainFlags(sub, a.get());
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
