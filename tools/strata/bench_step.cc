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

namespace strata::cli {
namespace {

struct Flags {
  int blocks = 16;
  std::string block_bytes = "16M";
  double compute_ms = 40;
  std::string device_mem = "0";
  std::string host_mem = "0";
  std::vector<std::string> nvme;
  int steps = 3;
  int micro_batches = 1;
  double grad_clip = 0;
  std::string trace;
  bool json = false;
  std::string device = "auto";
  std::string io = "auto";
  int cpu_threads = 0;
  std::string rendezvous;
  double comm_timeout = 0;
  std::string comm_backend = "auto";       // auto, gloo or nccl
  std::string collective_memory = "auto";  // auto, device or host
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

Status Run(const Flags& f) {
  if (f.blocks < 1) return Status::InvalidArgument("--blocks must be >= 1");
  if (f.steps < 1) return Status::InvalidArgument("--steps must be >= 1");
  if (f.micro_batches < 1) return Status::InvalidArgument("--micro-batches must be >= 1");
  if (f.compute_ms < 0) return Status::InvalidArgument("--compute-ms must be >= 0");
  STRATA_ASSIGN_OR_RETURN(uint64_t block_bytes, ParseBytes("--block-bytes", f.block_bytes));
  STRATA_ASSIGN_OR_RETURN(uint64_t device_mem, ParseBytes("--device-mem", f.device_mem));
  STRATA_ASSIGN_OR_RETURN(uint64_t host_mem, ParseBytes("--host-mem", f.host_mem));
  const uint64_t numel = std::max<uint64_t>(block_bytes / 4, 1);
  STRATA_ASSIGN_OR_RETURN(IoBackendKind io_kind, ParseIoBackendKind(f.io));
  if (f.device != "auto" && f.device != "cpu" && f.device != "cuda") {
    return Status::InvalidArgument("--device " + f.device + ": use auto, cpu or cuda");
  }
  STRATA_RETURN_IF_ERROR(CheckCommBackend(f.comm_backend));
  if (f.comm_backend == "nccl" && (f.device == "cpu" || (f.device == "auto" && !CudaAvailable()))) {
    return Status::InvalidArgument(
        "--comm-backend nccl needs a CUDA device (NCCL moves GPU memory), but --device " +
        f.device + (f.device == "auto" ? " finds no GPU" : " is the host") +
        "; pass --device cuda on a machine with a GPU, or --comm-backend gloo");
  }
  STRATA_ASSIGN_OR_RETURN(CollectiveMemory collective_memory,
                          ParseCollectiveMemory(f.collective_memory));

  RankInfo ri;
  if (auto r = RankInfoFromEnv(); r.ok()) {
    ri = *r;
  } else if (r.status().code() != StatusCode::kNotFound) {
    return r.status();
  }
  // `comm` is the Gloo communicator (host memory); the NCCL one, when used, is created once
  // the CUDA device exists (below). With one rank, --comm-backend nccl still runs the engine's
  // collectives through a one-rank NCCL communicator (its Gloo partner then meets in a
  // temporary folder), so one GPU measures that path.
  JoinedRanks ranks;
  if (ri.world_size > 1 || f.comm_backend == "nccl") {
    JoinOptions jo;
    jo.rendezvous = f.rendezvous;
    jo.timeout_seconds = f.comm_timeout;
    jo.store_prefix = "strata-bench-step";
    jo.one_rank_folder_prefix = "/var/tmp/strata-bench-step-";
    STRATA_ASSIGN_OR_RETURN(ranks, JoinRanks(ri, jo, /*failed_step=*/nullptr));
  }
  Communicator* const comm = ranks.gloo.get();
  const bool lead = ri.rank == 0;
  const int world = ri.world_size;

  std::unique_ptr<Device> device;
  DeviceOptions dopt;
  dopt.memory_budget_bytes = device_mem;
  // Each rank of a host drives its own GPU: the one numbered by its local rank.
  dopt.cuda_device = ri.local_rank;
  if (f.device == "cuda" || (f.device == "auto" && CudaAvailable())) {
    auto d = CreateCudaDevice(dopt);
    if (!d.ok()) {
      return Status(d.status())
          .Annotate("--device " + f.device + " (GPU " + std::to_string(ri.local_rank) +
                    (world > 1 ? ", this rank's local rank" : "") + ")");
    }
    device = std::move(d).value();
  } else {
    STRATA_ASSIGN_OR_RETURN(device, CreateHostDevice(dopt));
  }
  const bool cuda = device->Kind() == DeviceKind::kCuda;
  if (f.comm_backend == "nccl" && !cuda) {
    return Status::InvalidArgument(
        "--comm-backend nccl needs a CUDA device (NCCL moves GPU memory), but --device " +
        f.device + " found none; pass --comm-backend gloo");
  }
  // The NCCL communicator lives on the device's comm stream: declared after the device so
  // that it goes first, and before the engine, which uses it until it is destroyed.
  std::unique_ptr<Communicator> nccl;
  {
    auto n = CreateEngineNccl(ranks, f.comm_backend, *device);
    if (!n.ok()) {
      return Status(n.status())
          .Annotate("--comm-backend " + f.comm_backend + ": joining the other ranks' GPUs");
    }
    nccl = std::move(n).value();
  }

  TempFolder temp;  // the NVMe folder when none was given
  std::vector<std::string> nvme;
  for (const std::string& p : f.nvme) nvme.push_back(RankPath(p, ri));
  if (nvme.empty() && host_mem != 0) {
    STRATA_ASSIGN_OR_RETURN(std::string dir, temp.Make("/var/tmp/strata-bench-step-"));
    nvme.push_back(dir);
  }

  std::vector<BlockSpec> blocks;
  for (int b = 0; b < f.blocks; ++b) {
    blocks.push_back(
        BlockSpec{"block." + std::to_string(b), {TensorSpec{"w", {int64_t(numel)}, true}}});
  }
  EngineOptions opt;
  opt.device = device.get();
  opt.device_mem_bytes = device_mem;
  opt.host_mem_bytes = host_mem;
  opt.nvme_paths = nvme;
  opt.io.kind = io_kind;
  opt.micro_batches = f.micro_batches;
  opt.grad_clip = f.grad_clip;
  opt.trace_path = RankPath(f.trace, ri);
  opt.comm = nccl ? nccl.get() : comm;
  opt.host_comm = nccl ? comm : nullptr;  // nullptr: opt.comm (Gloo) does both
  opt.collective_memory = collective_memory;
  opt.optimizer_threads = f.cpu_threads;
  opt.dtype = WorkingDtype::kFp32;  // the bench moves fp32 params on every device
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
          nccl ? std::string(comm_backend) + ", host-side collectives on " + host_comm_backend
               : std::string(comm_backend);
      std::printf(
          "# ranks: %d (%s; collectives in %s memory; each holds 1/%d of every state; rows per "
          "rank below)\n",
          world, backends.c_str(), memory, world);
    }
    std::printf(
        "# strata bench step: %d blocks x %s MiB fp32 params, compute %.1f ms forward / "
        "%.1f ms backward per block, %d micro-batch(es), %d step(s)%s\n",
        f.blocks, Mib(flat_bytes).c_str(), f.compute_ms, 2 * f.compute_ms, f.micro_batches, f.steps,
        f.grad_clip > 0 ? (", grad clip " + std::to_string(f.grad_clip)).c_str() : "");
    std::printf("# device %s, nvme %s\n", device->Name().c_str(),
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
    for (int m = 0; m < f.micro_batches; ++m) {
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
                     {"micro_batches", f.micro_batches},
                     {"grad_clip", f.grad_clip},
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
  cmd->add_option("--device-mem", flags->device_mem,
                  "Device memory budget for params and gradient buffers (0 = unlimited)")
      ->capture_default_str();
  cmd->add_option("--host-mem", flags->host_mem,
                  "Pinned host memory budget (0 = unlimited: everything stays in host memory)")
      ->capture_default_str();
  cmd->add_option("--nvme", flags->nvme,
                  "Folder for the NVMe tier; repeat to stripe over drives (default: a temporary "
                  "folder under /var/tmp, removed at exit)");
  cmd->add_option("--steps", flags->steps, "Steps to run")->capture_default_str();
  cmd->add_option("--micro-batches", flags->micro_batches,
                  "Micro-batches per step (gradients accumulate on the host)")
      ->capture_default_str();
  cmd->add_option("--grad-clip", flags->grad_clip, "Clip the global gradient norm (0 = off)")
      ->capture_default_str();
  cmd->add_option("--trace", flags->trace, "Write a Chrome/Perfetto trace JSON to this file");
  cmd->add_flag("--json", flags->json, "Machine-readable output");
  cmd->add_option("--cpu-threads", flags->cpu_threads,
                  "OpenMP threads of the CPU optimizer (0 = one per core)")
      ->capture_default_str();
  cmd->add_option("--device", flags->device, "auto | cpu | cuda")->capture_default_str();
  cmd->add_option("--io", flags->io, "NVMe backend: auto | uring | posix")->capture_default_str();
  cmd->add_option("--rendezvous", flags->rendezvous,
                  "With WORLD_SIZE > 1 (under strata launch): where ranks meet, file:DIR or "
                  "redis:HOST:PORT; default STRATA_RENDEZVOUS. --nvme and --trace may contain "
                  "{rank} and {local_rank}");
  cmd->add_option("--comm-timeout", flags->comm_timeout,
                  "Seconds a collective waits for a peer (default STRATA_COMM_TIMEOUT)");
  cmd->add_option("--comm-backend", flags->comm_backend,
                  "What the engine's all-gathers and reduce-scatters run on: gloo (TCP, host "
                  "memory; any device), nccl (GPU memory; needs a CUDA device; with one rank it "
                  "still runs them) or auto (nccl on a CUDA device, else gloo). Gloo always "
                  "joins the ranks for the host-side collectives; each rank uses GPU LOCAL_RANK")
      ->capture_default_str();
  cmd->add_option("--collective-memory", flags->collective_memory,
                  "Where the collectives run: device (in device memory; 1/N of each block over "
                  "H2D/D2H), host (in pinned host buffers; whole blocks over H2D/D2H) or auto "
                  "(device whenever the communicator reaches device memory)")
      ->capture_default_str();
  cmd->callback([flags, exit_code] {
    Status s = Run(*flags);
    if (!s.ok()) {
      std::fprintf(stderr, "strata bench step: %s\n", s.ToString().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace strata::cli
