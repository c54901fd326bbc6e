// What `strata train` prints; see train_report.h.
#include "tools/strata/train_report.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>

#include "comm/messages.h"
#include "model/gemm_profile.h"
#include "strata/bytes.h"
#include "tools/strata/interrupt.h"
#include "tools/strata/report_json.h"

namespace strata::cli {
namespace {

std::string Duration(double s) {
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

// Where a step's time went beyond compute, as shares of the step: "stall 12% tail 23%",
// plus "redone 3" when updates were redone.
std::string StepTimeSplit(const StepStats& st) {
  const auto pct = [&](double x) { return st.seconds > 0 ? int(100.0 * x / st.seconds + 0.5) : 0; };
  char buf[64];
  std::snprintf(buf, sizeof buf, "stall %2d%% tail %2d%%", pct(st.stall_seconds),
                pct(st.tail_seconds));
  std::string out = buf;
  if (st.redone_blocks > 0) out += " redone " + std::to_string(st.redone_blocks);
  return out;
}

int64_t TokensPerStep(const trainer::TrainOptions& t) {
  return static_cast<int64_t>(t.batch) * t.seq_len * t.micro_batches;
}

// The ranks line: how many, from where, what the collectives run on and in which memory.
void PrintRanks(const TrainReportInputs& in) {
  const trainer::RunSetup& setup = *in.setup;
  const RankInfo& ri = setup.rank();
  // What the engine's collectives ran on, and where; the host communicator only when it is
  // another one.
  const char* comm_backend = setup.engine_comm()->backend();
  const char* host_comm_backend = setup.host_comm()->backend();
  // The engine resolves auto (to device or host) when there are collectives.
  const CollectiveMemory memory = in.engine->Placement().collective_memory;
  const std::string backends = setup.nccl()
                                   ? std::string(comm_backend) + ", host-side collectives on " +
                                         host_comm_backend + " over TCP"
                                   : std::string(comm_backend) + " over TCP";
  const std::string where =
      std::string("collectives in ") + CollectiveMemoryName(memory) + " memory";
  const std::string source =
      ri.source.empty() ? std::string("one rank") : "from " + ri.source + " variables";
  std::printf("# ranks: %d (%s; %s; %s); %d rows of each micro-batch per rank\n", ri.world_size,
              source.c_str(), backends.c_str(), where.c_str(), in.train->batch / ri.world_size);
}

// The predicted bound: the engine predicts the transfers; the compute side is predicted
// here by timing the model's own GEMMs (the bulk of its FLOPs) once on this machine.
void PrintPredictedBound(const TrainReportInputs& in) {
  const PlacementReport& pl = in.engine->Placement();
  const trainer::TrainOptions& t = *in.train;
  double compute_s = 0;
  if (in.setup->device().Kind() == DeviceKind::kCuda) {
    // The GEMM timing below runs on the host; on a GPU the model's kernels are timed with
    // CUDA events every step instead.
    std::printf(
        "# predicted bound per step: transfers %.4f s (%s); compute: measured each step with "
        "CUDA events (the step line's compute and eff count it)\n",
        pl.predicted_bound_seconds, pl.predicted_bound_resource.c_str());
    return;
  }
  if (in.setup->device().Kind() == DeviceKind::kHost) {
    std::printf("# timing the model's GEMMs for the predicted bound ...\n");
    std::fflush(stdout);
    model::GemmRunner gemms(model::ModelGemms(*in.model, t.batch, t.seq_len));
    compute_s = gemms.TimedRun() * t.micro_batches;
  }
  std::printf(
      "# predicted bound per step: %.4f s (%s); transfers %.4f s (%s), compute >= "
      "%.4f s (the model's GEMMs alone, timed now)\n",
      std::max(compute_s, pl.predicted_bound_seconds),
      compute_s > pl.predicted_bound_seconds ? "compute" : pl.predicted_bound_resource.c_str(),
      pl.predicted_bound_seconds, pl.predicted_bound_resource.c_str(), compute_s);
}

// The first signal received on any rank (0: none): every rank stops after the same step.
Result<int> AgreeOnInterrupt(const TrainReportInputs& in, std::string* what) {
  const int32_t mine = InterruptSignal();
  Communicator* comm = in.setup->host_comm();
  if (comm == nullptr) return int(mine);
  auto all = AllGatherMessages(*comm, mine, "train: agree on an interrupt");
  if (!all.ok()) {
    *what = "agreeing on an interrupt";
    return all.status();
  }
  for (int32_t sig : *all) {
    if (sig != 0) return int(sig);
  }
  return 0;
}

}  // namespace

int64_t DefaultLogEvery(int64_t steps) {
  constexpr int64_t kLines = 50;
  // The interval must reach ceil(steps / kLines), computed so that nothing overflows: the
  // product kLines * interval wrapped past 2^63 for --steps near the int64 limit, and the
  // loop never ended. An interval of up to 5e18 fits, and covers every int64 step count.
  const int64_t need = steps / kLines + (steps % kLines > 0 ? 1 : 0);
  for (int64_t decade = 1;; decade *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (need <= m * decade) return m * decade;
    }
  }
}

StartupPhase::StartupPhase(const std::string& what)
    : what_(what), start_(std::chrono::steady_clock::now()) {
  std::printf("# %s ...", what.c_str());
  std::fflush(stdout);
  previous_sink_ = SetLogSink([this](LogLevel level, std::string_view message) {
    if (line_open_ && level <= log_internal::Threshold()) {
      std::printf("\n");
      std::fflush(stdout);
      line_open_ = false;
    }
    if (previous_sink_) {
      previous_sink_(level, message);
    } else {
      log_internal::WriteToStderr(level, message);
    }
  });
}

StartupPhase::~StartupPhase() {
  if (!done_) End("failed");
}

void StartupPhase::Done() {
  done_ = true;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char how[48];
  std::snprintf(how, sizeof(how), "done (%.1f s)", s);
  End(how);
}

void StartupPhase::End(const std::string& how) {
  SetLogSink(previous_sink_);  // once it returns, the sink above is not running nor called
  if (line_open_) {
    std::printf(" %s\n", how.c_str());
  } else {
    std::printf("# %s: %s\n", what_.c_str(), how.c_str());
  }
  std::fflush(stdout);
}

void PrintConfig(const TrainReportInputs& in) {
  const model::Gpt2Config& cfg = *in.model;
  const trainer::TrainOptions& t = *in.train;
  const trainer::RunSetup& setup = *in.setup;
  const uint64_t params = model::Gpt2NumParams(cfg);
  std::printf("# strata train: GPT-2 %d layers, d_model %d, %d heads, seq %d, vocab %d\n",
              cfg.layers, cfg.d_model, cfg.heads, t.seq_len, cfg.vocab);
  std::printf("# parameters: %llu (%s fp32)\n", static_cast<unsigned long long>(params),
              FormatBytes(params * 4).c_str());
  std::printf("# data: %s; %lld training / %lld held-out tokens\n", in.data->description.c_str(),
              static_cast<long long>(in.batcher->train_tokens()),
              static_cast<long long>(in.batcher->val_tokens()));
  std::printf(
      "# batch: %d rows x %d tokens x %d micro-batches = %lld tokens/step; %lld steps; "
      "lr %g (%s, warmup %lld); %s\n",
      t.batch, t.seq_len, t.micro_batches, static_cast<long long>(TokensPerStep(t)),
      static_cast<long long>(t.steps), t.lr, in.lr_schedule.c_str(),
      static_cast<long long>(t.warmup), t.recompute ? "recompute" : "no recompute");
  if (setup.DeviceNote().empty()) {
    std::printf("# device: %s\n", setup.device().Name().c_str());
  } else {
    std::printf("# device: %s (%s)\n", setup.device().Name().c_str(), setup.DeviceNote().c_str());
  }
  std::fflush(stdout);
}

nlohmann::json PrintPlacement(const TrainReportInputs& in) {
  const model::Gpt2Config& cfg = *in.model;
  const trainer::TrainOptions& t = *in.train;
  const trainer::RunSetup& setup = *in.setup;
  const trainer::RunConfig& rc = setup.config();
  const Engine& engine = *in.engine;
  const uint64_t params = model::Gpt2NumParams(cfg);
  const PlacementReport& pl = engine.Placement();
  uint64_t state_bytes = 0;
  for (const ComponentPlacement& c : pl.components) state_bytes += c.bytes;
  std::printf("# model + optimizer states: %s\n", FormatBytes(state_bytes).c_str());
  if (setup.host_comm() != nullptr) PrintRanks(in);
  // The engine's placement report: where each component lives and why ("# " lines).
  std::string placement = pl.ToString();
  for (size_t p = 0, q; p < placement.size(); p = q + 1) {
    q = placement.find('\n', p);
    if (q == std::string::npos) q = placement.size();
    const std::string line = placement.substr(p, q - p);
    if (!line.empty()) std::printf("%s%s\n", line[0] == '#' ? "" : "# ", line.c_str());
  }
  PrintPredictedBound(in);
  if (engine.ResumedStep() > 0) {
    std::printf("# resumed at step %lld\n", static_cast<long long>(engine.ResumedStep()));
  }
  std::fflush(stdout);

  const Communicator* engine_comm = setup.engine_comm();
  const Communicator* host_comm = setup.host_comm();
  return {{"layers", cfg.layers},
          {"d_model", cfg.d_model},
          {"heads", cfg.heads},
          {"seq_len", t.seq_len},
          {"vocab", cfg.vocab},
          {"params", params},
          {"batch", t.batch},
          {"micro_batches", t.micro_batches},
          {"steps", t.steps},
          {"lr", t.lr},
          {"lr_schedule", in.lr_schedule},
          {"warmup", t.warmup},
          {"weight_decay", rc.weight_decay},
          {"beta1", rc.beta1},
          {"beta2", rc.beta2},
          {"eps", rc.eps},
          {"grad_clip", rc.grad_clip},
          {"state_dtype", StateFormatName(rc.state_format)},
          {"state_rounding", StateRoundingName(rc.state_rounding)},
          {"master_dtype", MasterFormatName(rc.master_format)},
          {"grad_dtype", GradDtypeName(rc.grad_dtype)},
          {"seed", in.seed},
          {"recompute", t.recompute},
          {"device", setup.device().Name()},
          {"device_mem", rc.device_mem_bytes},
          {"host_mem", rc.host_mem_bytes},
          {"nvme", in.nvme},
          {"data", in.data->description},
          {"resumed_step", engine.ResumedStep()},
          {"world_size", setup.rank().world_size},
          {"comm_backend", engine_comm ? engine_comm->backend() : "none"},
          {"host_comm_backend", host_comm ? host_comm->backend() : "none"},
          {"collective_memory", CollectiveMemoryName(pl.collective_memory)}};
}

namespace {

// RunSteps' reporting: each step's line, --json record and totals, once its statistics are
// final (Engine::TakeCommittedStats): at its commit, which with pipelined updates lands
// during the next step (or at the flush after the last one).
class StepReporter {
 public:
  StepReporter(const TrainReportInputs& in, nlohmann::json* steps_json, TrainTotals* totals)
      : in_(in),
        steps_json_(steps_json),
        totals_(totals),
        last_(in.train->steps),
        tokens_per_step_(static_cast<double>(TokensPerStep(*in.train))),
        flops_per_step_(
            model::Gpt2TrainFlopsPerToken(*in.model, in.train->seq_len, in.train->recompute) *
            tokens_per_step_),
        tty_(isatty(STDOUT_FILENO)),
        log_every_(in.log_every > 0 ? in.log_every : DefaultLogEvery(last_)) {}

  bool tty() const { return tty_; }
  // A step's EndStep returned: its loss, learning rate and model time, until it commits.
  void Ended(const trainer::StepResult& r) { ended_.push_back(r); }
  // Reports every ended step that committed since the last call.
  void Committed() {
    for (const StepStats& st : in_.engine->TakeCommittedStats()) {
      while (!ended_.empty() && ended_.front().step < st.step) ended_.pop_front();
      if (ended_.empty() || ended_.front().step != st.step) continue;  // not this run's
      Report(ended_.front(), st);
      ended_.pop_front();
    }
  }

 private:
  void Add(const trainer::StepResult& r, const StepStats& st);
  void Report(const trainer::StepResult& r, const StepStats& st);

  const TrainReportInputs& in_;
  nlohmann::json* steps_json_;
  TrainTotals* totals_;
  const int64_t last_;
  const double tokens_per_step_, flops_per_step_;
  const bool tty_;
  const int64_t log_every_;
  std::deque<trainer::StepResult> ended_;
};

// The step into the totals.
void StepReporter::Add(const trainer::StepResult& r, const StepStats& st) {
  TrainTotals* t = totals_;
  if (t->steps++ == 0) t->first_step = r.step;
  t->last_step = r.step;
  t->stall_seconds += st.stall_seconds;
  t->tail_seconds += st.tail_seconds;
  t->redone_blocks += st.redone_blocks;
  t->redone_steps += st.redone_blocks > 0 ? 1 : 0;
  t->redo_seconds += st.redo_seconds;
  t->speculative_steps += st.speculative ? 1 : 0;
  t->bound_seconds += st.bound_seconds;
  if (st.skipped) ++t->skipped_steps;
  t->losses.push_back(r.loss);
  t->seconds += st.seconds;
  t->model_flops += flops_per_step_;
  t->compute_seconds += r.compute_seconds;
  t->bytes.nvme_read += st.bytes.nvme_read;
  t->bytes.nvme_write += st.bytes.nvme_write;
  t->bytes.h2d += st.bytes.h2d;
  t->bytes.d2h += st.bytes.d2h;
  t->bytes.comm += st.bytes.comm;
  for (int i = 0; i < kNumResources; ++i) t->busy[i] += st.busy_seconds[i];
}

void StepReporter::Report(const trainer::StepResult& r, const StepStats& st) {
  Add(r, st);
  const int64_t s = r.step;
  const double tps = st.seconds > 0 ? tokens_per_step_ / st.seconds : 0;
  const double tflops = st.seconds > 0 ? flops_per_step_ / st.seconds / 1e12 : 0;
  // The engine's bound counts the transfers and the compute it times itself; the model's
  // kernels timed on the device (CUDA) bound the step too.
  const bool compute_bound = r.compute_seconds > st.bound_seconds;
  const double eff =
      compute_bound && st.seconds > 0 ? r.compute_seconds / st.seconds : st.efficiency;
  const std::string bound_resource = compute_bound ? "compute" : st.bound_resource;
  const double eta = totals_->seconds / totals_->steps * static_cast<double>(last_ - s);
  // The engine's figures as `bench step --json` has them, with the model's.
  nlohmann::json step = StepStatsJson(st);
  step["step"] = s;
  step["loss"] = r.loss;
  step["tokens_per_s"] = tps;
  step["model_tflops_per_s"] = tflops;
  step["compute_seconds"] = r.compute_seconds;
  if (compute_bound) {
    step["efficiency"] = eff;
    step["bound_seconds"] = r.compute_seconds;
    step["bound_resource"] = bound_resource;
  }
  step["lr"] = r.lr;
  steps_json_->push_back(std::move(step));
  char compute[48] = "";
  if (r.compute_seconds > 0) {
    std::snprintf(compute, sizeof compute, "  compute %.3f s", r.compute_seconds);
  }
  char line[320];
  std::snprintf(line, sizeof line,
                "step %5lld/%lld  loss %.4f  %8.0f tok/s  %.3g TFLOP/s%s  eff %.2f (%s)  %s  "
                "ETA %s",
                static_cast<long long>(s), static_cast<long long>(last_), r.loss, tps, tflops,
                compute, eff, bound_resource.c_str(), StepTimeSplit(st).c_str(),
                Duration(eta).c_str());
  if (tty_) {
    const int width = 20;
    const int filled = static_cast<int>(width * s / std::max<int64_t>(1, last_));
    std::printf("\r[%s%s] %s\033[K", std::string(filled, '#').c_str(),
                std::string(width - filled, ' ').c_str(), line);
    std::fflush(stdout);
  } else if (s % log_every_ == 0 || s == last_ || totals_->steps == 1) {
    std::printf("%s\n", line);
    std::fflush(stdout);
  }
}

}  // namespace

Status RunSteps(trainer::Trainer& trainer, const TrainReportInputs& in, int64_t val_every,
                const AfterStep& after_step, nlohmann::json* steps_json, TrainTotals* totals,
                std::string* what) {
  const int64_t last = in.train->steps;
  StepReporter reporter(in, steps_json, totals);
  totals->resumed_step = in.engine->ResumedStep();
  int64_t ran = 0;
  for (int64_t s = trainer.next_step(); s <= last; ++s) {
    STRATA_ASSIGN_OR_RETURN(totals->interrupted, AgreeOnInterrupt(in, what));
    if (totals->interrupted != 0) break;
    auto r = trainer.Step();
    if (!r.ok()) {
      if (const auto& stopped = trainer.stopped_step()) {
        // --max-skipped-steps: the step that stopped the run ended (its update skipped) and
        // is reported like the others once it commits.
        reporter.Ended(*stopped);
        if (in.engine->Flush().ok()) reporter.Committed();
      }
      if (reporter.tty() && ran > 0) std::printf("\n");
      *what = "step " + std::to_string(s);
      return r.status();
    }
    ++ran;
    reporter.Ended(*r);
    reporter.Committed();
    if (val_every > 0 && (s % val_every == 0 || s == last)) {
      auto v = trainer.ValidationLoss();  // reads the weights: step s commits first
      if (!v.ok()) {
        *what = "validation";
        return v.status();
      }
      reporter.Committed();
      if (reporter.tty()) std::printf("\n");
      std::printf("val step %lld  loss %.4f\n", static_cast<long long>(s), *v);
      if (!steps_json->empty() && steps_json->back()["step"] == s) {
        steps_json->back()["val_loss"] = *v;
      }
    }
    if (after_step) {
      STRATA_RETURN_IF_ERROR(after_step(s));
      reporter.Committed();
    }
  }
  // The last step's deferred updates (--pipeline) run and it commits before anything reports
  // it, also after Ctrl-C.
  *what = "committing the last step";
  STRATA_RETURN_IF_ERROR(in.engine->Flush());
  reporter.Committed();
  if (reporter.tty() && ran > 0) std::printf("\n");
  return Status::OK();
}

void PrintTotals(const TrainTotals& t) {
  if (t.steps == 0) return;
  std::printf("# %lld steps (%lld..%lld) in %.2f s (%.3f s/step)\n",
              static_cast<long long>(t.steps), static_cast<long long>(t.first_step),
              static_cast<long long>(t.last_step), t.seconds, t.seconds / t.steps);
  // The first step's loss against the mean of the last (up to) 10: one number that says
  // whether training worked, robust to the noise of single batches.
  const size_t tail = std::min<size_t>(10, t.losses.size());
  double last = 0;
  for (size_t i = t.losses.size() - tail; i < t.losses.size(); ++i) last += t.losses[i];
  last /= static_cast<double>(tail);
  // A resumed run's first loss is that of the step after the resumed one, not of step 1.
  char first[96];
  if (t.resumed_step > 0) {
    std::snprintf(first, sizeof first, "step %lld (the first after resuming at step %lld)",
                  static_cast<long long>(t.first_step), static_cast<long long>(t.resumed_step));
  } else {
    std::snprintf(first, sizeof first, "first step");
  }
  std::printf("# loss: %s %.4f, mean of the last %zu steps %.4f (%+.1f%%)\n", first,
              t.losses.front(), tail, last, 100.0 * (last - t.losses.front()) / t.losses.front());
  std::printf(
      "# model: %.4g TFLOP in the steps, %.3g TFLOP/s (6 x params x tokens, attention, "
      "recompute)",
      t.model_flops / 1e12, t.seconds > 0 ? t.model_flops / t.seconds / 1e12 : 0.0);
  if (t.compute_seconds > 0) {
    std::printf("; model kernels %.3f s (CUDA events), %.1f%% of the step time, %.3g TFLOP/s",
                t.compute_seconds, t.seconds > 0 ? 100.0 * t.compute_seconds / t.seconds : 0.0,
                t.model_flops / t.compute_seconds / 1e12);
  }
  std::printf("\n");
  if (t.skipped_steps > 0) {
    std::printf("# %lld steps skipped: their gradient was not finite, nothing was updated\n",
                static_cast<long long>(t.skipped_steps));
  }
  std::printf("#%-11s %14s %14s\n", "edge", "bytes", "per_step");
  const std::pair<const char*, uint64_t> edges[] = {{"nvme_read", t.bytes.nvme_read},
                                                    {"nvme_write", t.bytes.nvme_write},
                                                    {"h2d", t.bytes.h2d},
                                                    {"d2h", t.bytes.d2h},
                                                    {"comm", t.bytes.comm}};
  for (const auto& [name, b] : edges) {
    std::printf(" %-11s %14s %14s\n", name, FormatBytes(b).c_str(),
                FormatBytes(b / uint64_t(std::max<int64_t>(t.steps, 1))).c_str());
  }
  std::printf("#%-11s %10s %10s\n", "resource", "busy_s", "busy_%");
  for (int i = 0; i < kNumResources; ++i) {
    std::printf(" %-11s %10.3f %10.1f\n", ResourceName(static_cast<Resource>(i)), t.busy[i],
                t.seconds > 0 ? 100.0 * t.busy[i] / t.seconds : 0.0);
  }
  // The step time the compute lane did not use: waiting for data before its last operation
  // (stall), and the serial tail after it (updates, writes and commit that backward did not
  // hide).
  std::printf("#%-11s %10s %10s\n", "step_time", "seconds", "%_of_steps");
  const std::pair<const char*, double> split[] = {{"stall", t.stall_seconds},
                                                  {"tail", t.tail_seconds}};
  for (const auto& [name, x] : split) {
    std::printf(" %-11s %10.3f %10.1f\n", name, x, t.seconds > 0 ? 100.0 * x / t.seconds : 0.0);
  }
  if (t.speculative_steps > 0) {
    std::printf(
        "# speculative steps (updates before the norm): %lld; redone (clipping or a non-finite "
        "gradient applied): %lld steps, %lld block updates, %.3f s\n",
        static_cast<long long>(t.speculative_steps), static_cast<long long>(t.redone_steps),
        static_cast<long long>(t.redone_blocks), t.redo_seconds);
  }
}

}  // namespace strata::cli

namespace strata::cli {

nlohmann::json TotalsJson(const TrainTotals& t) {
  nlohmann::json busy;
  for (int i = 0; i < kNumResources; ++i) busy[ResourceName(static_cast<Resource>(i))] = t.busy[i];
  nlohmann::json out = {
      {"steps", t.steps},
      {"first_step", t.first_step},
      {"last_step", t.last_step},
      {"resumed_step", t.resumed_step},
      {"interrupted", t.interrupted != 0},
      {"seconds", t.seconds},
      {"bound_seconds", t.bound_seconds},
      {"stall_seconds", t.stall_seconds},
      {"skipped_steps", t.skipped_steps},
      {"tail_seconds", t.tail_seconds},
      {"redone_blocks", t.redone_blocks},
      {"redone_steps", t.redone_steps},
      {"redo_seconds", t.redo_seconds},
      {"speculative_steps", t.speculative_steps},
      {"model_flops", t.model_flops},
      {"model_tflops_per_s", t.seconds > 0 ? t.model_flops / t.seconds / 1e12 : 0},
      {"compute_seconds", t.compute_seconds},
      {"busy_seconds", busy},
      {"bytes",
       {{"nvme_read", t.bytes.nvme_read},
        {"nvme_write", t.bytes.nvme_write},
        {"h2d", t.bytes.h2d},
        {"d2h", t.bytes.d2h},
        {"comm", t.bytes.comm}}}};
  if (t.interrupted != 0) out["signal"] = InterruptName(t.interrupted);
  if (!t.losses.empty()) {
    out["first_loss"] = t.losses.front();
    out["last_loss"] = t.losses.back();
  }
  return out;
}

}  // namespace strata::cli
