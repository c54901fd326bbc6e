// `strata bench step`: a synthetic training step through the engine, with no model, to size
// budgets before a real run and to measure how close the engine gets to its own bound.
//
// The "model" is --blocks blocks of --block-bytes of fp32 parameters each. Per block and
// micro-batch, forward occupies the device's compute lane for --compute-ms and backward for
// twice that (Device::EnqueueBusy: a timed kernel on CUDA, a sleeping lane worker on the
// host device, so it costs no host CPU), then writes a zero gradient. With zero gradients
// and no weight decay AdamW leaves every parameter unchanged, which makes the run
// self-checking: after the last step every block's master weights must equal what was
// written at the start and both moments must be zero; #wrong counts blocks that differ.
//
// With --micro-batches M the order is --micro-batch-order's (as in `strata train`): layer-major
// runs every micro-batch through a block before the next, so a block's params cross once
// per pass and (on one rank) its gradient once per step; --activation-bytes is what one
// micro-batch keeps on the device from its forward to its backward, and the (M-1) more that
// layer-major keeps are allocated on the device, inside --device-mem (the engine gets the
// rest).
//
// With --activation-stash the activations go through the engine instead (Engine::
// StashActivation, docs/design.md "Activations"): each block's forward stashes
// --activation-bytes per micro-batch from a device buffer and its backward fetches them
// (last=true), so the stash's traffic (host slots, spills to NVMe, prefetch) is measured; the
// device keeps none of them, and the two device buffers come out of --device-mem.
//
// Compare where the collectives run on the same machine with --collective-memory device vs
// host (and, on GPUs, --comm-backend nccl vs gloo).
//
// Run (one line): strata bench step --blocks 16 --block-bytes 16M --compute-ms 40
//        --device-mem 96M --host-mem 320M --nvme /var/tmp/swap --steps 4 --trace step.json
//
// Across ranks (ZeRO-3 sharding over Gloo): strata launch -n 2 -- strata bench step ...
// --nvme /var/tmp/swap/{rank} --trace step.{rank}.json. Each rank holds its shard; rank 0
// prints one row per rank and step (the others' figures are gathered), with the
// collectives' bytes and busy time as their own resource ("comm").
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/messages.h"
#include "strata/bytes.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/io.h"
#include "strata/status.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/report_json.h"
#include "tools/strata/run_flags.h"
#include "trainer/micro_batch_order.h"
#include "trainer/run_setup.h"

namespace strata::cli {
namespace {

struct Flags {
  int blocks = 16;
  std::string block_bytes = "16M";
  double compute_ms = 40;
  int steps = 3;
  std::string activation_bytes = "0";  // one micro-batch's saved activations on the device
  bool activation_stash = false;       // per block and micro-batch, through the engine's stash
  std::string json;                    // FILE, or "-" for standard output
  bool keep = false;                   // keep the NVMe subfolders (and their state) at exit
  RunFlags run;  // --device, budgets, --nvme, --grad-clip, ranks, ... (as `strata train`)
};

// One rank's figures of one step, gathered on rank 0 (plain doubles, sent as bytes).
struct RankRow {
  double seconds, bound_seconds, efficiency, stall_seconds, comm_busy_seconds, compute_busy_seconds;
  double nvme_read, nvme_write, h2d, d2h, comm_bytes;
  double bound_resource;  // Resource index, or -1 for "nvme"
};

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", double(bytes) / (1 << 20));
  return buf;
}

float Pattern(int block, uint64_t i) {
  return float(int((i * 2654435761u + block * 97) % 2001) - 1000) * 1e-3f;
}

// The run's shared settings (those of `strata train`), then ranks, device and the engine's
// options through the trainer's one run-setup path. Errors name the flag in *what.
Status Setup(const Flags& f, std::unique_ptr<trainer::RunSetup>* setup, EngineOptions* opt,
             std::vector<TempFolder>* temps, std::string* what) {
  trainer::RunConfig config;
  STRATA_RETURN_IF_ERROR(ApplyRunFlags(f.run, &config, what));
  // The device holds only the engine's buffers here, so its budget caps it too.
  config.cap_device_allocations = true;
  // A zero gradient with no weight decay leaves every parameter unchanged, which the
  // self-check relies on; decay costs the same time, so the step still models training.
  config.weight_decay = 0;
  // Durable as `strata train` is by default: with --nvme each step ends with its commit.
  STRATA_ASSIGN_OR_RETURN(*setup, trainer::RunSetup::Begin(config, what));
  STRATA_RETURN_IF_ERROR(
      (*setup)->Start({"strata-bench-step", "/var/tmp/strata-bench-step-"}, what));
  STRATA_ASSIGN_OR_RETURN(*opt, (*setup)->MakeEngineOptions(what));
  // A fresh subfolder of each --nvme folder (made when missing), so that no earlier run's
  // state is found there; or one under /var/tmp when none is given and states may spill.
  *what = "--nvme";
  temps->resize(opt->nvme_paths.size());
  for (size_t i = 0; i < opt->nvme_paths.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(opt->nvme_paths[i],
                            (*temps)[i].Make(opt->nvme_paths[i] + "/strata-bench-step-"));
  }
  if (opt->nvme_paths.empty() && opt->host_mem_bytes != 0) {
    temps->resize(1);
    STRATA_ASSIGN_OR_RETURN(std::string dir, (*temps)[0].Make("/var/tmp/strata-bench-step-"));
    opt->nvme_paths.push_back(dir);
  }
  // The bench moves fp32 params on every device; a bf16 master is the bf16 params themselves.
  opt->dtype =
      opt->master_format == MasterFormat::kFp32 ? WorkingDtype::kFp32 : WorkingDtype::kBf16;
  what->clear();
  return Status::OK();
}

// One bench run: the engine over --blocks synthetic blocks, and what each step reports.
class BenchStep {
 public:
  explicit BenchStep(const Flags& f) : f_(f) {}
  ~BenchStep() {
    for (void* p : {activations_, stash_src_, stash_dst_}) {
      if (p != nullptr) (void)setup_->device().Free(p);
    }
  }
  BenchStep(const BenchStep&) = delete;
  BenchStep& operator=(const BenchStep&) = delete;

  // Sets the run up (ranks, device, engine) and writes every block's starting parameters.
  Status Create(std::string* what) {
    if (f_.blocks < 1) return Status::InvalidArgument("--blocks must be >= 1");
    if (f_.steps < 1) return Status::InvalidArgument("--steps must be >= 1");
    if (f_.compute_ms < 0) return Status::InvalidArgument("--compute-ms must be >= 0");
    STRATA_RETURN_IF_ERROR(CheckOutput("--json", f_.json));  // before the run, not after it
    STRATA_ASSIGN_OR_RETURN(uint64_t block_bytes, ParseBytes("--block-bytes", f_.block_bytes));
    numel_ = std::max<uint64_t>(block_bytes / 4, 1);
    STRATA_RETURN_IF_ERROR(Setup(f_, &setup_, &opt_, &temps_, what));
    std::vector<BlockSpec> blocks;
    for (int b = 0; b < f_.blocks; ++b) {
      blocks.push_back(
          BlockSpec{"block." + std::to_string(b), {TensorSpec{"w", {int64_t(numel_)}, true}}});
    }
    STRATA_ASSIGN_OR_RETURN(const uint64_t acts,
                            ParseBytes("--activation-bytes", f_.activation_bytes));
    if (f_.activation_stash) STRATA_RETURN_IF_ERROR(SetUpStash(acts, what));
    const trainer::MicroBatchOrderInputs order_in{
        .choice = setup_->config().micro_batch_order,
        .micro_batches = opt_.micro_batches,
        .saved_activation_bytes = f_.activation_stash ? 0 : acts,
        .offload_shape = {},
        .multi_rank = world() > 1,
        .unlimited_room_bytes = 0,
        .recompute_seconds = std::nullopt};
    *what = "budgets (--device-mem, --host-mem, --nvme) or --micro-batch-order";
    STRATA_ASSIGN_OR_RETURN(trainer::OrderedEngine made,
                            trainer::CreateOrderedEngine(blocks, opt_, order_in));
    what->clear();
    engine_ = std::move(made.engine);
    order_ = made.order;
    accumulate_on_device_ = made.accumulate_on_device;
    order_reason_ = made.reason;
    if (made.activation_bytes > 0) {
      // What layer-major keeps on the device beyond batch-major, held for the whole run.
      STRATA_ASSIGN_OR_RETURN(activations_, setup_->device().Allocate(made.activation_bytes));
    }
    padded_ = engine_->Layout()[0].padded_numel;
    for (int b = 0; b < f_.blocks; ++b) {
      std::vector<float> v(numel_);
      for (uint64_t i = 0; i < numel_; ++i) v[i] = Pattern(b, i);
      STRATA_RETURN_IF_ERROR(engine_->WriteParams(b, 0, v));
    }
    return engine_->CommitParams();
  }

  // The whole run: a header, then per step one row per rank (rank 0 prints), the data check
  // after the last, and with --json the document at the end.
  Status Run() {
    const bool lead = setup_->rank().rank == 0;
    // With --json -, standard output carries the JSON alone; the table goes to standard error.
    const JsonDestination json(lead ? f_.json : "");
    if (lead) PrintHeader();
    nlohmann::json steps = nlohmann::json::array();
    for (int s = 0; s < f_.steps; ++s) {
      STRATA_RETURN_IF_ERROR(Step().status());
      // A step's figures are final when it commits: with pipelined updates during the next
      // step (or at the Flush after the last), so each row is a step that committed.
      const bool last = s + 1 == f_.steps;
      if (last) STRATA_RETURN_IF_ERROR(engine_->Flush());
      const std::vector<StepStats> committed = engine_->TakeCommittedStats();
      for (size_t i = 0; i < committed.size(); ++i) {
        const bool final_row = last && i + 1 == committed.size();
        STRATA_RETURN_IF_ERROR(Report(committed[i], final_row, json, &steps));
      }
    }
    if (json.enabled()) STRATA_RETURN_IF_ERROR(json.Write("--json", RunJson(steps).dump(2) + "\n"));
    if (f_.keep) {
      for (TempFolder& t : temps_) {
        const std::string kept = t.Release();
        if (!kept.empty())
          std::fprintf(stderr, "# kept the NVMe state in %s (--keep)\n", kept.c_str());
      }
    }
    return Status::OK();
  }

 private:
  // One committed step: every rank's row (rank 0 prints), its --json entry, and after the
  // run's last step the data check (it reads every state back).
  Status Report(const StepStats& st, bool final_row, const JsonDestination& json,
                nlohmann::json* steps) {
    const bool lead = setup_->rank().rank == 0;
    int64_t wrong = -1;  // -1: not checked
    if (final_row) {
      STRATA_ASSIGN_OR_RETURN(wrong, CountWrongBlocks());
    }
    // Every rank's figures (one row each), gathered on every rank; rank 0 prints them.
    std::vector<RankRow> rows;
    std::vector<int64_t> wrongs;
    STRATA_RETURN_IF_ERROR(Gather(st, wrong, &rows, &wrongs));
    if (lead) PrintRows(st.step, rows, wrongs);
    if (lead && stash_bytes_) PrintActivations(st);
    if (wrong < 0) {
      for (int64_t w : wrongs) wrong = std::max(wrong, w);
    } else {
      wrong = 0;
      for (int64_t w : wrongs) wrong += w;
    }
    steps->push_back(StepJson(st, rows, wrong));
    if (wrong > 0) {
      if (json.enabled())
        (void)json.Write("--json", nlohmann::json{{"steps", *steps}}.dump(2) + "\n");
      return Status::Corruption(std::to_string(wrong) +
                                " block(s) came back different from what was written");
    }
    return Status::OK();
  }

  // --activation-stash: the engine stashes `acts` per block and micro-batch (at most every
  // block of every micro-batch live at once), from and to two device buffers taken out of
  // --device-mem before the engine gets the rest.
  Status SetUpStash(uint64_t acts, std::string* what) {
    *what = "--activation-stash";
    if (acts == 0) return Status::InvalidArgument("needs --activation-bytes > 0");
    stash_bytes_ = acts;
    opt_.activation_bytes = acts;
    opt_.activation_count = f_.blocks * opt_.micro_batches;
    const uint64_t buffers = 2 * RoundUp(acts, 256);
    if (opt_.device_mem_bytes != 0) {
      if (buffers >= opt_.device_mem_bytes) {
        return Status::OutOfMemory("the two device buffers of --activation-bytes (" +
                                   FormatBytes(buffers) + ") take all of --device-mem " +
                                   FormatBytes(opt_.device_mem_bytes));
      }
      opt_.device_mem_bytes -= buffers;
    }
    Device& device = setup_->device();
    STRATA_ASSIGN_OR_RETURN(stash_src_, device.Allocate(acts));
    STRATA_ASSIGN_OR_RETURN(stash_dst_, device.Allocate(acts));
    stash_pattern_.resize(acts);
    for (uint64_t i = 0; i < acts; ++i) stash_pattern_[i] = uint8_t(i * 131 + 7);
    STRATA_RETURN_IF_ERROR(device.CopyToDevice(stash_src_, stash_pattern_.data(), acts,
                                               "activation pattern", Lane::kCompute));
    STRATA_RETURN_IF_ERROR(device.SynchronizeLane(Lane::kCompute));
    what->clear();
    return Status::OK();
  }

  uint64_t flat_bytes() const { return padded_ * 4; }
  int world() const { return setup_->rank().world_size; }
  // What the engine's collectives run on ("none" without); the host one only when another.
  const char* comm_backend() const { return opt_.comm ? opt_.comm->backend() : "none"; }
  const char* host_comm_backend() const {
    return setup_->host_comm() ? setup_->host_comm()->backend() : "none";
  }
  // The engine resolves auto (to device or host) when there are collectives.
  const char* memory() const {
    return CollectiveMemoryName(engine_->Placement().collective_memory);
  }

  void PrintHeader() const {
    if (setup_->host_comm() != nullptr) {
      const std::string backends =
          setup_->nccl()
              ? std::string(comm_backend()) + ", host-side collectives on " + host_comm_backend()
              : std::string(comm_backend());
      std::printf(
          "# ranks: %d (%s; collectives in %s memory; each holds 1/%d of every state; rows per "
          "rank below)\n",
          world(), backends.c_str(), memory(), world());
    }
    std::printf(
        "# strata bench step: %d blocks x %s MiB fp32 params, compute %.1f ms forward / "
        "%.1f ms backward per block, %d micro-batch(es), %d step(s)%s\n",
        f_.blocks, Mib(flat_bytes()).c_str(), f_.compute_ms, 2 * f_.compute_ms, opt_.micro_batches,
        f_.steps,
        opt_.grad_clip > 0 ? (", grad clip " + std::to_string(opt_.grad_clip)).c_str() : "");
    const std::string note = setup_->DeviceNote().empty() ? "" : " (" + setup_->DeviceNote() + ")";
    std::string nvme;
    for (const auto& p : opt_.nvme_paths) nvme += (nvme.empty() ? "" : ", ") + p;
    std::printf("# device %s%s, nvme %s%s\n", setup_->device().Name().c_str(), note.c_str(),
                nvme.empty() ? "none" : nvme.c_str(),
                nvme.empty() ? "" : (" (" + IoSettingsText(opt_) + ")").c_str());
    std::printf("# micro-batches: %s\n", order_reason_.c_str());
    std::fputs(engine_->Placement().ToString().c_str(), stdout);
    std::printf("# %4s %4s %9s %9s %-10s %6s %8s %10s %10s %9s %9s %9s %9s %7s\n", "step", "rank",
                "time_s", "bound_s", "bound_by", "effic", "stall_s", "nvme_rd_MiB", "nvme_wr_MiB",
                "h2d_MiB", "d2h_MiB", "comm_MiB", "comm_s", "#wrong");
    std::printf(
        "#   (bound_by: the busiest resource; nvme = the drives' read+write busy time; comm = "
        "collectives, bus bytes and busy time)\n");
  }

  // One step, each block's compute emulated on the compute lane and its gradient a copy of
  // zeros. Batch-major: per micro-batch, forward over the blocks then backward in reverse.
  // Layer-major: per block, every micro-batch; on one rank within one access (the gradient
  // summed on the device: zeros stay zeros), across ranks one access per micro-batch.
  Result<StepStats> Step() {
    // Zeros on the host, copied over each gradient on the compute lane (works on any device).
    if (zeros_.empty()) zeros_.assign(padded_, 0.0f);
    STRATA_RETURN_IF_ERROR(engine_->BeginStep(StepArgs{.lr = 1e-3}));
    const int M = opt_.micro_batches;
    if (order_ == MicroBatchOrder::kLayerMajor) {
      const int accesses = accumulate_on_device_ ? 1 : M;
      for (int b = 0; b < f_.blocks; ++b) {
        for (int a = 0; a < accesses; ++a)
          STRATA_RETURN_IF_ERROR(Access(b, Pass::kForward, a * (M / accesses), M / accesses));
      }
      for (int b = f_.blocks - 1; b >= 0; --b) {
        for (int a = 0; a < accesses; ++a)
          STRATA_RETURN_IF_ERROR(Access(b, Pass::kBackward, a * (M / accesses), M / accesses));
      }
    } else {
      for (int m = 0; m < M; ++m) {
        for (int b = 0; b < f_.blocks; ++b) STRATA_RETURN_IF_ERROR(Access(b, Pass::kForward, m, 1));
        for (int b = f_.blocks - 1; b >= 0; --b) {
          STRATA_RETURN_IF_ERROR(Access(b, Pass::kBackward, m, 1));
        }
      }
    }
    return engine_->EndStep();
  }

  // One access of block b: the compute of `micro` micro-batches from `first`, with their
  // activations stashed in forward and fetched in backward (--activation-stash), and in
  // backward the gradient.
  Status Access(int b, Pass pass, int first, int micro) {
    Device& device = setup_->device();
    const auto fwd = std::chrono::nanoseconds(int64_t(f_.compute_ms * 1e6));
    const auto busy = pass == Pass::kForward ? fwd : 2 * fwd;
    STRATA_RETURN_IF_ERROR(engine_->Acquire(b, pass).status());
    for (int m = first; m < first + micro; ++m) {
      const uint32_t key = uint32_t(b * opt_.micro_batches + m);
      if (stash_bytes_ && pass == Pass::kBackward) {
        STRATA_RETURN_IF_ERROR(engine_->FetchActivation(key, stash_dst_, /*last=*/true));
      }
      if (busy.count() > 0) {
        STRATA_RETURN_IF_ERROR(device.EnqueueBusy(Lane::kCompute, busy,
                                                  pass == Pass::kForward ? "forward" : "backward"));
      }
      if (stash_bytes_ && pass == Pass::kForward) {
        // The source never changes, so the stash's event needs no wait here.
        STRATA_RETURN_IF_ERROR(engine_->StashActivation(key, stash_src_, stash_bytes_).status());
      }
    }
    if (pass == Pass::kBackward) {
      STRATA_ASSIGN_OR_RETURN(float* grad, engine_->GradBuffer(b));
      STRATA_RETURN_IF_ERROR(
          device.CopyToDevice(grad, zeros_.data(), flat_bytes(), "zero grad", Lane::kCompute));
      STRATA_RETURN_IF_ERROR(engine_->SubmitGrads(b));
    }
    return engine_->Release(b);
  }

  // Blocks of this rank's shard whose master weights differ from what was written, or whose
  // moments are not zero.
  Result<int64_t> CountWrongBlocks() const {
    int64_t wrong = 0;
    // This rank's shard: elements [first, first + shard) of each block.
    const uint64_t shard = engine_->Layout()[0].shard_numel;
    const uint64_t first = uint64_t(setup_->rank().rank) * shard;
    const uint64_t mine = numel_ > first ? std::min(shard, numel_ - first) : 0;
    std::vector<float> v(shard);
    for (int b = 0; b < f_.blocks; ++b) {
      bool bad = false;
      STRATA_RETURN_IF_ERROR(engine_->ReadComponent(b, Component::kMaster, v));
      // A bf16 master holds the pattern rounded to nearest (a zero update keeps its bits).
      const bool bf16 = engine_->Placement().master_format != MasterFormat::kFp32;
      for (uint64_t i = 0; i < mine && !bad; ++i) {
        const float want = Pattern(b, first + i);
        bad = v[i] != (bf16 ? Bf16ToFloat(FloatToBf16(want)) : want);
      }
      for (Component c : {Component::kExpAvg, Component::kExpAvgSq}) {
        STRATA_RETURN_IF_ERROR(engine_->ReadComponent(b, c, v));
        for (uint64_t i = 0; i < mine && !bad; ++i) bad = v[i] != 0.0f;
      }
      wrong += bad ? 1 : 0;
    }
    if (stash_bytes_) {  // the last fetch brought the stashed pattern back
      std::vector<uint8_t> got(stash_bytes_);
      Device& device = setup_->device();
      STRATA_RETURN_IF_ERROR(device.CopyToHost(got.data(), stash_dst_, stash_bytes_,
                                               "activation check", Lane::kCompute));
      STRATA_RETURN_IF_ERROR(device.SynchronizeLane(Lane::kCompute));
      wrong += got == stash_pattern_ ? 0 : 1;
    }
    return wrong;
  }

  // Every rank's row and data-check count, in rank order (this rank's alone with one rank).
  Status Gather(const StepStats& st, int64_t wrong, std::vector<RankRow>* rows,
                std::vector<int64_t>* wrongs) const {
    RankRow mine{st.seconds,
                 st.bound_seconds,
                 st.efficiency,
                 st.stall_seconds,
                 st.busy_seconds[int(Resource::kComm)],
                 st.busy_seconds[int(Resource::kCompute)],
                 double(st.bytes.nvme_read),
                 double(st.bytes.nvme_write),
                 double(st.bytes.h2d),
                 double(st.bytes.d2h),
                 double(st.bytes.comm),
                 -1};
    for (int r = 0; r < kNumResources; ++r) {
      if (st.bound_resource == ResourceName(Resource(r))) mine.bound_resource = r;
    }
    Communicator* comm = setup_->host_comm();
    if (comm == nullptr) {
      *rows = {mine};
      *wrongs = {wrong};
      return Status::OK();
    }
    STRATA_ASSIGN_OR_RETURN(*rows, AllGatherMessages(*comm, mine, "bench: gather rows"));
    STRATA_ASSIGN_OR_RETURN(*wrongs, AllGatherMessages(*comm, wrong, "bench: gather rows"));
    return Status::OK();
  }

  void PrintRows(int64_t step, const std::vector<RankRow>& rows,
                 const std::vector<int64_t>& wrongs) const {
    for (size_t r = 0; r < rows.size(); ++r) {
      const RankRow& x = rows[r];
      const std::string by =
          x.bound_resource < 0 ? "nvme" : ResourceName(Resource(int(x.bound_resource)));
      std::printf("  %4" PRId64
                  " %4zu %9.3f %9.3f %-10s %6.3f %8.3f %10s %10s %9s %9s %9s %9.3f %7s\n",
                  step, r, x.seconds, x.bound_seconds, by.c_str(), x.efficiency, x.stall_seconds,
                  Mib(uint64_t(x.nvme_read)).c_str(), Mib(uint64_t(x.nvme_write)).c_str(),
                  Mib(uint64_t(x.h2d)).c_str(), Mib(uint64_t(x.d2h)).c_str(),
                  Mib(uint64_t(x.comm_bytes)).c_str(), x.comm_busy_seconds,
                  wrongs[r] < 0 ? "-" : std::to_string(wrongs[r]).c_str());
    }
    std::fflush(stdout);
  }

  // Rank 0's activation stash traffic (StepStats::activation_bytes), a comment line per step.
  void PrintActivations(const StepStats& st) const {
    const EdgeBytes& a = st.activation_bytes;
    std::printf("#   step %" PRId64
                " activations: d2h %s MiB, h2d %s MiB, nvme_wr %s MiB, nvme_rd %s MiB; %" PRId64
                " fetch(es) waited for NVMe\n",
                st.step, Mib(a.d2h).c_str(), Mib(a.h2d).c_str(), Mib(a.nvme_write).c_str(),
                Mib(a.nvme_read).c_str(), st.activation_fetch_waits);
    std::fflush(stdout);
  }

  nlohmann::json StepJson(const StepStats& st, const std::vector<RankRow>& rows,
                          int64_t wrong) const {
    nlohmann::json out = StepStatsJson(st);
    if (world() > 1) {
      nlohmann::json per_rank = nlohmann::json::array();
      for (int r = 0; r < world(); ++r) {
        per_rank.push_back({{"rank", r},
                            {"seconds", rows[r].seconds},
                            {"bound_seconds", rows[r].bound_seconds},
                            {"efficiency", rows[r].efficiency},
                            {"comm_busy_seconds", rows[r].comm_busy_seconds},
                            {"comm_bytes", uint64_t(rows[r].comm_bytes)}});
      }
      out["ranks"] = per_rank;
    }
    if (wrong >= 0) out["wrong"] = wrong;
    return out;
  }

  nlohmann::json RunJson(const nlohmann::json& steps) const {
    const PlacementReport& place = engine_->Placement();
    nlohmann::json out;
    out["config"] = {{"blocks", f_.blocks},
                     {"block_bytes", flat_bytes()},
                     {"compute_ms", f_.compute_ms},
                     {"device", setup_->device().Name()},
                     {"device_mem", opt_.device_mem_bytes},
                     {"host_mem", opt_.host_mem_bytes},
                     {"nvme", opt_.nvme_paths},
                     {"micro_batches", opt_.micro_batches},
                     {"micro_batch_order", MicroBatchOrderName(order_)},
                     {"activation_bytes", f_.activation_bytes},
                     {"activation_stash", f_.activation_stash},
                     {"grad_clip", opt_.grad_clip},
                     {"world_size", world()},
                     {"comm_backend", comm_backend()},
                     {"host_comm_backend", host_comm_backend()},
                     {"collective_memory", memory()}};
    out["placement"] = PlacementJson(place);
    out["steps"] = steps;
    return out;
  }

  const Flags& f_;
  uint64_t numel_ = 0;   // fp32 parameters per block
  uint64_t padded_ = 0;  // the engine's padded block size (elements)
  // Destroyed in reverse order: the engine before the set-up (device, communicators) and
  // the NVMe subfolders it uses (removed unless --keep).
  std::vector<TempFolder> temps_;
  std::unique_ptr<trainer::RunSetup> setup_;
  EngineOptions opt_;
  std::unique_ptr<Engine> engine_;
  MicroBatchOrder order_ = MicroBatchOrder::kBatchMajor;
  bool accumulate_on_device_ = false;
  std::string order_reason_;
  // The device memory layer-major's extra activations take (freed first at destruction).
  void* activations_ = nullptr;
  // --activation-stash: bytes per block and micro-batch (0: off), the device buffers stashed
  // from and fetched into, and the pattern the source holds.
  uint64_t stash_bytes_ = 0;
  void* stash_src_ = nullptr;
  void* stash_dst_ = nullptr;
  std::vector<uint8_t> stash_pattern_;
  std::vector<float> zeros_;
};

Status Run(const Flags& f, std::string* what) {
  BenchStep bench(f);
  STRATA_RETURN_IF_ERROR(bench.Create(what));
  return bench.Run();
}

}  // namespace

void AddBenchStep(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = bench.add_subcommand(
      "step",
      "A synthetic training step through the engine (no model): time, lower bound, "
      "efficiency, bytes per link and stall time per step, and the placement chosen. Use it "
      "to size --device-mem/--host-mem before a real run.");
  cmd->add_option("--blocks", flags->blocks, "Number of blocks (layers)")->capture_default_str();
  cmd->add_option("--block-bytes", flags->block_bytes,
                  "fp32 parameter bytes per block (K/M/G suffixes)")
      ->capture_default_str();
  cmd->add_option("--compute-ms", flags->compute_ms,
                  "Device compute per block: forward this many ms, backward twice that "
                  "(emulated on the compute lane; 0 = I/O-bound)")
      ->capture_default_str();
  cmd->add_option("--steps", flags->steps, "Steps to run")->capture_default_str();
  cmd->add_option("--activation-bytes", flags->activation_bytes,
                  "Activations one micro-batch keeps on the device from its forward to its "
                  "backward (K/M/G suffixes); layer-major keeps --micro-batches of them, and "
                  "what it keeps beyond one counts in --device-mem")
      ->capture_default_str();
  cmd->add_flag("--activation-stash", flags->activation_stash,
                "Stash --activation-bytes per block and micro-batch in the engine (forward) and "
                "fetch them back (backward) instead of keeping them on the device: the "
                "activation stash's traffic per link is reported per step");
  cmd->add_option("--json", flags->json,
                  "Write the configuration, placement and per-step results as JSON to FILE (-: "
                  "standard output, which then carries the JSON alone; the table goes to "
                  "standard error)");
  cmd->add_flag("--keep", flags->keep,
                "Keep the NVMe subfolders (and the state in them) at exit; they are printed");
  // The flags of every engine run, with `strata train`'s defaults: a bench step models a
  // training step.
  AddRunFlags(cmd, &flags->run,
              "Folder for the NVMe tier, made when missing; repeat to stripe over drives; "
              "{rank} and {local_rank} are replaced by the rank's numbers. The run uses a "
              "fresh subfolder of each, removed at exit unless --keep (default with a finite "
              "--host-mem: a temporary folder under /var/tmp)");
  SetCallbackWithConfig(
      cmd,
      [flags] {
        std::string what;  // the flag or step that failed, when known
        Status s = Run(*flags, &what);
        if (s.ok()) return 0;
        std::fprintf(stderr, "strata bench step: %s%s%s\n", what.c_str(), what.empty() ? "" : ": ",
                     s.ToString().c_str());
        return 1;
      },
      exit_code);
}

}  // namespace strata::cli
