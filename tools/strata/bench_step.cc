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

#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/io.h"
#include "strata/status.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/run_flags.h"
#include "trainer/run_setup.h"

namespace strata::cli {
namespace {

struct Flags {
  int blocks = 16;
  std::string block_bytes = "16M";
  double compute_ms = 40;
  int steps = 3;
  bool json = false;
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
             TempFolder* temp, std::string* what) {
  trainer::RunConfig config;
  STRATA_RETURN_IF_ERROR(ApplyRunFlags(f.run, &config, what));
  // The device holds only the engine's buffers here, so its budget caps it too.
  config.cap_device_allocations = true;
  // A zero gradient with no weight decay leaves every parameter unchanged, which the
  // self-check relies on; decay costs the same time, so the step still models training.
  config.weight_decay = 0;
  // Not durable: the bench measures steps, not commits for --resume.
  config.durable = false;
  STRATA_ASSIGN_OR_RETURN(*setup, trainer::RunSetup::Begin(config, what));
  STRATA_RETURN_IF_ERROR(
      (*setup)->Start({"strata-bench-step", "/var/tmp/strata-bench-step-"}, what));
  STRATA_ASSIGN_OR_RETURN(*opt, (*setup)->MakeEngineOptions(what));
  if (opt->nvme_paths.empty() && opt->host_mem_bytes != 0) {
    *what = "--nvme";  // the NVMe folder when none was given
    STRATA_ASSIGN_OR_RETURN(std::string dir, temp->Make("/var/tmp/strata-bench-step-"));
    opt->nvme_paths.push_back(dir);
  }
  opt->dtype = WorkingDtype::kFp32;  // the bench moves fp32 params on every device
  what->clear();
  return Status::OK();
}

Status Run(const Flags& f, std::string* what) {
  if (f.blocks < 1) return Status::InvalidArgument("--blocks must be >= 1");
  if (f.steps < 1) return Status::InvalidArgument("--steps must be >= 1");
  if (f.compute_ms < 0) return Status::InvalidArgument("--compute-ms must be >= 0");
  STRATA_ASSIGN_OR_RETURN(uint64_t block_bytes, ParseBytes("--block-bytes", f.block_bytes));
  const uint64_t numel = std::max<uint64_t>(block_bytes / 4, 1);
  std::unique_ptr<trainer::RunSetup> setup;
  EngineOptions opt;
  TempFolder temp;  // the NVMe folder when none was given
  STRATA_RETURN_IF_ERROR(Setup(f, &setup, &opt, &temp, what));
  const RankInfo& ri = setup->rank();
  Device* const device = &setup->device();
  Communicator* const comm = setup->host_comm();
  const bool lead = ri.rank == 0;
  const int world = ri.world_size;
  const std::vector<std::string>& nvme = opt.nvme_paths;
  const uint64_t device_mem = opt.device_mem_bytes, host_mem = opt.host_mem_bytes;
  const int micro_batches = opt.micro_batches;
  const double grad_clip = opt.grad_clip;

  std::vector<BlockSpec> blocks;
  for (int b = 0; b < f.blocks; ++b) {
    blocks.push_back(
        BlockSpec{"block." + std::to_string(b), {TensorSpec{"w", {int64_t(numel)}, true}}});
  }
  auto created = Engine::Create(blocks, opt);
  if (!created.ok()) return created.status();
  std::unique_ptr<Engine> engine = std::move(created).value();
  const PlacementReport& place = engine->Placement();
  const char* comm_backend = opt.comm ? opt.comm->backend() : "none";
  const char* host_comm_backend = comm ? comm->backend() : "none";
  // The engine resolves auto (to device or host) when there are collectives.
  const char* memory = CollectiveMemoryName(place.collective_memory);

  const uint64_t flat_bytes = engine->Layout()[0].padded_numel * 4;
  // Zeros on the host, copied over each gradient on the compute lane (works on any device).
  std::vector<float> zeros(engine->Layout()[0].padded_numel, 0.0f);
  for (int b = 0; b < f.blocks; ++b) {
    std::vector<float> v(numel);
    for (uint64_t i = 0; i < numel; ++i) v[i] = Pattern(b, i);
    STRATA_RETURN_IF_ERROR(engine->WriteParams(b, 0, v));
  }
  STRATA_RETURN_IF_ERROR(engine->CommitParams());

  if (!f.json && lead) {
    if (comm) {
      const std::string backends =
          setup->nccl()
              ? std::string(comm_backend) + ", host-side collectives on " + host_comm_backend
              : std::string(comm_backend);
      std::printf(
          "# ranks: %d (%s; collectives in %s memory; each holds 1/%d of every state; rows per "
          "rank below)\n",
          world, backends.c_str(), memory, world);
    }
    std::printf(
        "# strata bench step: %d blocks x %s MiB fp32 params, compute %.1f ms forward / "
        "%.1f ms backward per block, %d micro-batch(es), %d step(s)%s\n",
        f.blocks, Mib(flat_bytes).c_str(), f.compute_ms, 2 * f.compute_ms, micro_batches, f.steps,
        grad_clip > 0 ? (", grad clip " + std::to_string(grad_clip)).c_str() : "");
    const std::string note = setup->DeviceNote().empty() ? "" : " (" + setup->DeviceNote() + ")";
    std::printf("# device %s%s, nvme %s\n", device->Name().c_str(), note.c_str(),
                nvme.empty() ? "none" : [&] {
                  std::string s;
                  for (const auto& p : nvme) s += (s.empty() ? "" : ", ") + p;
                  return s;
                }().c_str());
    std::fputs(place.ToString().c_str(), stdout);
    std::printf("# %4s %4s %9s %9s %-10s %6s %8s %10s %10s %9s %9s %9s %9s %7s\n", "step", "rank",
                "time_s", "bound_s", "bound_by", "effic", "stall_s", "nvme_rd_MiB", "nvme_wr_MiB",
                "h2d_MiB", "d2h_MiB", "comm_MiB", "comm_s", "#wrong");
    std::printf(
        "#   (bound_by: the busiest resource; nvme = the drives' read+write busy time; comm = "
        "collectives, bus bytes and busy time)\n");
  }
  nlohmann::json steps = nlohmann::json::array();
  const auto fwd = std::chrono::nanoseconds(int64_t(f.compute_ms * 1e6));
  const auto bwd = 2 * fwd;
  const int64_t first = engine->ResumedStep() + 1;
  for (int s = 0; s < f.steps; ++s) {
    STRATA_RETURN_IF_ERROR(engine->BeginStep(StepArgs{.lr = 1e-3}));
    for (int m = 0; m < micro_batches; ++m) {
      for (int b = 0; b < f.blocks; ++b) {
        STRATA_RETURN_IF_ERROR(engine->Acquire(b, Pass::kForward).status());
        if (fwd.count() > 0) {
          STRATA_RETURN_IF_ERROR(device->EnqueueBusy(Lane::kCompute, fwd, "forward"));
        }
        STRATA_RETURN_IF_ERROR(engine->Release(b));
      }
      for (int b = f.blocks - 1; b >= 0; --b) {
        STRATA_RETURN_IF_ERROR(engine->Acquire(b, Pass::kBackward).status());
        STRATA_ASSIGN_OR_RETURN(float* grad, engine->GradBuffer(b));
        if (bwd.count() > 0) {
          STRATA_RETURN_IF_ERROR(device->EnqueueBusy(Lane::kCompute, bwd, "backward"));
        }
        STRATA_RETURN_IF_ERROR(
            device->CopyToDevice(grad, zeros.data(), flat_bytes, "zero grad", Lane::kCompute));
        STRATA_RETURN_IF_ERROR(engine->SubmitGrads(b));
        STRATA_RETURN_IF_ERROR(engine->Release(b));
      }
    }
    STRATA_ASSIGN_OR_RETURN(StepStats st, engine->EndStep());
    // The data check after the last step (it reads every state back).
    int64_t wrong = -1;
    if (s + 1 == f.steps) {
      wrong = 0;
      // This rank's shard: elements [first, first + shard) of each block.
      const uint64_t shard = engine->Layout()[0].shard_numel;
      const uint64_t first_elem = uint64_t(ri.rank) * shard;
      const uint64_t mine = numel > first_elem ? std::min(shard, numel - first_elem) : 0;
      std::vector<float> v(shard);
      for (int b = 0; b < f.blocks; ++b) {
        bool bad = false;
        STRATA_RETURN_IF_ERROR(engine->ReadComponent(b, Component::kMaster, v));
        for (uint64_t i = 0; i < mine && !bad; ++i) bad = v[i] != Pattern(b, first_elem + i);
        for (Component c : {Component::kExpAvg, Component::kExpAvgSq}) {
          STRATA_RETURN_IF_ERROR(engine->ReadComponent(b, c, v));
          for (uint64_t i = 0; i < mine && !bad; ++i) bad = v[i] != 0.0f;
        }
        wrong += bad ? 1 : 0;
      }
    }
    // Every rank's figures (one row each), gathered on every rank; rank 0 prints them.
    RankRow mine_row{st.seconds,
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
      if (st.bound_resource == ResourceName(Resource(r))) mine_row.bound_resource = r;
    }
    std::vector<RankRow> rows(size_t(world), mine_row);
    std::vector<int64_t> wrongs(size_t(world), wrong);
    if (comm) {
      CollectiveOptions co;
      co.label = "bench: gather rows";
      STRATA_RETURN_IF_ERROR(
          comm->AllGather(&mine_row, rows.data(), sizeof(RankRow), CommDataType::kByte, co).Wait());
      STRATA_RETURN_IF_ERROR(
          comm->AllGather(&wrong, wrongs.data(), sizeof(int64_t), CommDataType::kByte, co).Wait());
    }
    if (!f.json && lead) {
      for (int r = 0; r < world; ++r) {
        const RankRow& x = rows[r];
        const std::string by =
            x.bound_resource < 0 ? "nvme" : ResourceName(Resource(int(x.bound_resource)));
        std::printf("  %4" PRId64
                    " %4d %9.3f %9.3f %-10s %6.3f %8.3f %10s %10s %9s %9s %9s %9.3f %7s\n",
                    st.step, r, x.seconds, x.bound_seconds, by.c_str(), x.efficiency,
                    x.stall_seconds, Mib(uint64_t(x.nvme_read)).c_str(),
                    Mib(uint64_t(x.nvme_write)).c_str(), Mib(uint64_t(x.h2d)).c_str(),
                    Mib(uint64_t(x.d2h)).c_str(), Mib(uint64_t(x.comm_bytes)).c_str(),
                    x.comm_busy_seconds, wrongs[r] < 0 ? "-" : std::to_string(wrongs[r]).c_str());
      }
      std::fflush(stdout);
    }
    if (wrong < 0) {
      for (int64_t w : wrongs) wrong = std::max(wrong, w);
    } else {
      wrong = 0;
      for (int64_t w : wrongs) wrong += w;
    }
    nlohmann::json busy;
    for (int r = 0; r < kNumResources; ++r) busy[ResourceName(Resource(r))] = st.busy_seconds[r];
    steps.push_back({{"step", st.step},
                     {"seconds", st.seconds},
                     {"bound_seconds", st.bound_seconds},
                     {"bound_resource", st.bound_resource},
                     {"efficiency", st.efficiency},
                     {"stall_seconds", st.stall_seconds},
                     {"nvme_busy_seconds", st.nvme_busy_seconds},
                     {"grad_norm", st.grad_norm},
                     {"peak_device_bytes", st.peak_device_bytes},
                     {"peak_host_bytes", st.peak_host_bytes},
                     {"busy_seconds", busy},
                     {"bytes",
                      {{"nvme_read", st.bytes.nvme_read},
                       {"nvme_write", st.bytes.nvme_write},
                       {"h2d", st.bytes.h2d},
                       {"d2h", st.bytes.d2h},
                       {"comm", st.bytes.comm}}}});
    if (world > 1) {
      nlohmann::json per_rank = nlohmann::json::array();
      for (int r = 0; r < world; ++r) {
        per_rank.push_back({{"rank", r},
                            {"seconds", rows[r].seconds},
                            {"bound_seconds", rows[r].bound_seconds},
                            {"efficiency", rows[r].efficiency},
                            {"comm_busy_seconds", rows[r].comm_busy_seconds},
                            {"comm_bytes", uint64_t(rows[r].comm_bytes)}});
      }
      steps.back()["ranks"] = per_rank;
    }
    if (wrong >= 0) steps.back()["wrong"] = wrong;
    if (wrong > 0) {
      if (f.json && lead) std::printf("%s\n", nlohmann::json{{"steps", steps}}.dump(2).c_str());
      return Status::Corruption(std::to_string(wrong) +
                                " block(s) came back different from what was written");
    }
  }
  (void)first;
  if (f.json && lead) {
    nlohmann::json out;
    out["config"] = {{"blocks", f.blocks},
                     {"block_bytes", flat_bytes},
                     {"compute_ms", f.compute_ms},
                     {"device", device->Name()},
                     {"device_mem", device_mem},
                     {"host_mem", host_mem},
                     {"nvme", nvme},
                     {"micro_batches", micro_batches},
                     {"grad_clip", grad_clip},
                     {"world_size", world},
                     {"comm_backend", comm_backend},
                     {"host_comm_backend", host_comm_backend},
                     {"collective_memory", memory}};
    nlohmann::json comps = nlohmann::json::array();
    for (const ComponentPlacement& c : place.components) {
      comps.push_back({{"block", c.block},
                       {"component", ComponentName(c.component)},
                       {"home", TierName(c.home)},
                       {"bytes", c.bytes}});
    }
    out["placement"] = {{"components", comps},
                        {"reasons", place.reasons},
                        {"device_min_bytes", place.device_min_bytes},
                        {"host_min_bytes", place.host_min_bytes}};
    out["steps"] = steps;
    std::printf("%s\n", out.dump(2).c_str());
  }
  return Status::OK();
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
  cmd->add_flag("--json", flags->json, "Machine-readable output");
  // The flags of every engine run, with `strata train`'s defaults: a bench step models a
  // training step.
  AddRunFlags(cmd, &flags->run,
              "Folder for the NVMe tier; repeat to stripe over drives; {rank} and {local_rank} "
              "are replaced by the rank's numbers (default with a finite --host-mem: a "
              "temporary folder under /var/tmp, removed at exit)");
  cmd->callback([flags, exit_code] {
    std::string what;  // the flag or step that failed, when known
    Status s = Run(*flags, &what);
    if (!s.ok()) {
      std::fprintf(stderr, "strata bench step: %s%s%s\n", what.c_str(), what.empty() ? "" : ": ",
                   s.ToString().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace strata::cli
