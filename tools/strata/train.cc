// `strata train`: trains GPT-2 through the engine, states spilling to pinned host memory and
// NVMe under the given budgets. See `strata train --help` and issue 5.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/messages.h"
#include "model/data.h"
#include "model/gemm_profile.h"
#include "model/gpt2.h"
#include "model/safetensors.h"
#include "trainer/trainer.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"

namespace strata::cli {
namespace {

struct TrainArgs {
  int layers = 4, d_model = 128, heads = 4, seq_len = 64, vocab = 256;
  std::string data, init, save, resume;
  int64_t val_every = 0;
  double lr = 1e-3;
  std::string lr_schedule = "constant";
  int64_t warmup = 0;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  int batch = 8, micro_batches = 1;
  int64_t steps = 100;
  uint64_t seed = 1;
  std::string device = "auto";
  std::string device_mem, host_mem;
  std::vector<std::string> nvme;
  std::string trace, json;
  int sample = 0;
  bool recompute = false;
  bool durable = true;
  std::string rendezvous;
  double comm_timeout = 0;                 // seconds; 0 = STRATA_COMM_TIMEOUT
  std::string comm_backend = "auto";       // auto, gloo or nccl
  std::string collective_memory = "auto";  // auto, device or host
  CLI::Option* heads_opt = nullptr;
};

std::string Bytes(double b) {
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else if (b >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1 << 20));
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

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

std::string Decode(const std::vector<int32_t>& toks, int vocab) {
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

int RunTrain(const TrainArgs& a) {
  using model::Gpt2Config;
  // ---- flags that decide the collectives (checked before any rank joins the others) ----
  if (a.device != "auto" && a.device != "cpu" && a.device != "cuda") {
    return Fail(Status::InvalidArgument("--device " + a.device + ": expected auto, cpu or cuda"),
                "--device");
  }
  if (Status s = CheckCommBackend(a.comm_backend); !s.ok()) return Fail(s, "--comm-backend");
  // auto stays on the CPU for now: the CUDA model path has compiled but has not yet run on
  // a GPU in this project's tests; --device cuda selects it explicitly.
  const bool want_cuda = a.device == "cuda";
  if (a.comm_backend == "nccl" && !want_cuda) {
    return Fail(Status::InvalidArgument(
                    "--comm-backend nccl needs --device cuda (NCCL moves GPU memory), but "
                    "--device is " +
                    a.device + (a.device == "auto" ? " (the CPU)" : "") +
                    "; pass --device cuda, or --comm-backend gloo (or auto) for a CPU run"),
                "--comm-backend");
  }
  auto collective_memory = ParseCollectiveMemory(a.collective_memory);
  if (!collective_memory.ok()) return Fail(collective_memory.status(), "--collective-memory");

  // ---- ranks ----
  RankInfo ri;
  ri.local_world_size = 1;
  if (auto r = RankInfoFromEnv(); r.ok()) {
    ri = *r;
  } else if (r.status().code() != StatusCode::kNotFound) {
    return Fail(r.status(), "rank environment");
  }
  // `ranks.gloo` (`comm` below) is the Gloo communicator (host memory); the NCCL one, when
  // used, is created once the CUDA device exists (below). With one rank there are no
  // collectives, except that --comm-backend nccl still runs the engine's through a one-rank
  // NCCL communicator, so one GPU exercises that path (its Gloo partner then meets in a
  // temporary folder).
  JoinedRanks ranks;
  const bool one_rank_nccl = ri.world_size == 1 && a.comm_backend == "nccl";
  if (ri.world_size > 1 || one_rank_nccl) {
    if (ri.world_size > 1) {
      g_rank_prefix =
          "rank " + std::to_string(ri.rank) + " of " + std::to_string(ri.world_size) + ": ";
    }
    if (a.batch % ri.world_size != 0) {
      return Fail(Status::InvalidArgument(
                      "--batch " + std::to_string(a.batch) + " does not split over " +
                      std::to_string(ri.world_size) +
                      " ranks (each rank takes batch/WORLD_SIZE rows of every micro-batch); "
                      "use a multiple of " +
                      std::to_string(ri.world_size)),
                  "--batch");
    }
    JoinOptions jo;
    jo.rendezvous = a.rendezvous;
    jo.timeout_seconds = a.comm_timeout;
    jo.store_prefix = "strata-train";
    jo.one_rank_folder_prefix = "/tmp/strata-train-rdzv-";
    std::string failed_step;
    auto joined = JoinRanks(ri, jo, &failed_step);
    if (!joined.ok()) return Fail(joined.status(), failed_step);
    ranks = std::move(joined).value();
    // Rank 0 alone reports: the others' standard output goes nowhere (errors still reach
    // standard error, prefixed with the rank).
    if (ri.rank != 0) {
      std::fflush(stdout);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        ::dup2(devnull, STDOUT_FILENO);
        ::close(devnull);
      }
    }
  }
  Communicator* const comm = ranks.gloo.get();  // nullptr: one rank, no collectives
  const bool lead = ri.rank == 0;
  // ---- data ----
  model::TokenStream data;
  if (a.data.empty()) {
    data = model::DefaultCorpus();
  } else {
    auto d = model::LoadTokens(a.data);
    if (!d.ok()) return Fail(d.status(), "--data");
    data = std::move(d).value();
  }
  // ---- model configuration ----
  Gpt2Config cfg;
  std::unique_ptr<model::SafetensorsReader> init;
  if (!a.init.empty() && !lead) {
    // Rank 0 reads --init and sends its configuration (and, later, the weights).
    auto shared =
        ShareFromRoot<Gpt2Config>(*comm, 0, std::nullopt, "broadcast --init configuration");
    if (!shared.ok()) {
      return Fail(shared.status(), "receiving the --init configuration from rank 0");
    }
    if (!shared->has_value()) {
      return Fail(Status::Aborted("rank 0 could not read --init " + a.init), "--init");
    }
    cfg = **shared;
    if (a.seq_len > cfg.max_seq) {
      return Fail(
          Status::InvalidArgument("--seq-len " + std::to_string(a.seq_len) + " exceeds the " +
                                  std::to_string(cfg.max_seq) + " rows of wpe.weight in " + a.init),
          "--seq-len");
    }
  } else if (!a.init.empty()) {
    // With several ranks, the others wait for this configuration (a failure is sent too).
    auto send = [&](bool ok) {
      if (!comm) return;
      (void)ShareFromRoot(*comm, 0, ok ? std::optional<Gpt2Config>(cfg) : std::nullopt,
                          "broadcast --init configuration");
    };
    auto r = model::SafetensorsReader::Open(a.init);
    if (!r.ok()) {
      send(false);
      return Fail(r.status(), "--init");
    }
    init = std::make_unique<model::SafetensorsReader>(std::move(r).value());
    int heads = a.heads;
    if (a.heads_opt->count() == 0) {
      // The file does not record the head count; GPT-2 uses 64 channels per head.
      auto* wte = init->Find("wte.weight") ? init->Find("wte.weight")
                                           : init->Find("transformer.wte.weight");
      if (wte != nullptr && wte->shape.size() == 2 && wte->shape[1] % 64 == 0) {
        heads = static_cast<int>(wte->shape[1] / 64);
      }
    }
    auto c = model::ConfigFromSafetensors(*init, heads);
    if (!c.ok()) {
      send(false);
      return Fail(c.status(), "--init " + a.init);
    }
    cfg = *c;
    send(true);
    if (a.seq_len > cfg.max_seq) {
      return Fail(
          Status::InvalidArgument("--seq-len " + std::to_string(a.seq_len) + " exceeds the " +
                                  std::to_string(cfg.max_seq) + " rows of wpe.weight in " + a.init),
          "--seq-len");
    }
  } else {
    cfg.layers = a.layers;
    cfg.d_model = a.d_model;
    cfg.heads = a.heads;
    cfg.max_seq = a.seq_len;
    cfg.vocab = a.vocab;
  }
  if (Status s = cfg.Validate(); !s.ok()) return Fail(s, "model");
  if (data.vocab > cfg.vocab) {
    return Fail(
        Status::InvalidArgument(data.description + " holds token ids up to " +
                                std::to_string(data.vocab - 1) + " but the model's " +
                                "vocabulary is " + std::to_string(cfg.vocab) + "; raise --vocab"),
        "--vocab");
  }
  if (a.seq_len < 1 || a.batch < 1 || a.micro_batches < 1 || a.steps < 0) {
    return Fail(Status::InvalidArgument("--seq-len, --batch and --micro-batches must be >= 1 "
                                        "and --steps >= 0"),
                "flags");
  }
  trainer::TrainOptions to;
  to.seq_len = a.seq_len;
  to.batch = a.batch;
  to.micro_batches = a.micro_batches;
  to.lr = a.lr;
  to.warmup = a.warmup;
  to.steps = a.steps;
  to.recompute = a.recompute;
  to.comm = comm;
  if (a.lr_schedule == "cosine") {
    to.schedule = trainer::LrSchedule::kCosine;
  } else if (a.lr_schedule != "constant") {
    return Fail(
        Status::InvalidArgument("--lr-schedule " + a.lr_schedule + ": expected constant or cosine"),
        "--lr-schedule");
  }
  auto batcher = model::Batcher::Create(&data, a.batch, a.seq_len);
  if (!batcher.ok()) return Fail(batcher.status(), "--data");

  // ---- device and engine ----
  std::unique_ptr<Device> device;
  if (want_cuda) {
    // Each rank of a host drives its own GPU: the one numbered by its local rank.
    DeviceOptions dopt;
    dopt.cuda_device = ri.local_rank;
    auto d = CreateCudaDevice(dopt);
    if (!d.ok()) {
      return Fail(d.status(), "--device cuda (GPU " + std::to_string(ri.local_rank) +
                                  (ri.world_size > 1 ? ", this rank's local rank" : "") + ")");
    }
    device = std::move(d).value();
  } else {
    auto d = CreateHostDevice({});
    if (!d.ok()) return Fail(d.status(), "host device");
    device = std::move(d).value();
  }
  // NCCL joins the engine's collectives on a CUDA device; Gloo always carries the trainer's
  // own collectives (the --init broadcast, the loss) and the engine's host-side ones. The
  // NCCL communicator lives on the device's comm stream: declared after the device so that
  // it goes first, and before the engine, which uses it until it is destroyed.
  std::unique_ptr<Communicator> nccl;
  {
    auto n = CreateEngineNccl(ranks, a.comm_backend, *device);
    if (!n.ok()) return Fail(n.status(), "--comm-backend nccl: joining the other ranks' GPUs");
    nccl = std::move(n).value();
  }
  EngineOptions eo;
  eo.device = device.get();
  // An empty budget (the default) is unlimited.
  if (!a.device_mem.empty()) {
    auto dm = ParseBytes("--device-mem", a.device_mem);
    if (!dm.ok()) return Fail(dm.status(), "--device-mem");
    eo.device_mem_bytes = *dm;
  }
  if (!a.host_mem.empty()) {
    auto hm = ParseBytes("--host-mem", a.host_mem);
    if (!hm.ok()) return Fail(hm.status(), "--host-mem");
    eo.host_mem_bytes = *hm;
  }
  for (const std::string& p : a.nvme) eo.nvme_paths.push_back(RankPath(p, ri));
  const std::string resume = RankPath(a.resume, ri);
  if (!a.resume.empty()) {
    eo.resume = true;
    if (eo.nvme_paths.empty()) {
      eo.nvme_paths = {resume};
    } else if (std::find(eo.nvme_paths.begin(), eo.nvme_paths.end(), resume) ==
               eo.nvme_paths.end()) {
      return Fail(Status::InvalidArgument("--resume " + resume +
                                          " is not one of the --nvme folders; pass the folder "
                                          "that holds the swap store"),
                  "--resume");
    }
  }
  eo.beta1 = a.beta1;
  eo.beta2 = a.beta2;
  eo.eps = a.eps;
  eo.weight_decay = a.weight_decay;
  eo.grad_clip = a.grad_clip;
  eo.micro_batches = a.micro_batches;
  eo.trace_path = RankPath(a.trace, ri);
  eo.comm = nccl ? nccl.get() : comm;
  eo.host_comm = nccl ? comm : nullptr;  // nullptr: eo.comm (Gloo) does both
  eo.collective_memory = *collective_memory;
  eo.durable = a.durable && !eo.nvme_paths.empty();
  const std::vector<BlockSpec> specs = model::Gpt2BlockSpecs(cfg);
  auto engine_or = Engine::Create(specs, eo);
  if (!engine_or.ok()) return Fail(engine_or.status(), "engine");
  std::unique_ptr<Engine> engine = std::move(engine_or).value();
  if (comm) {
    // Every rank must resume the same step (each rank's store holds its own shard).
    if (Status s = AgreeOnResumedStep(*comm, engine->ResumedStep()); !s.ok()) {
      return Fail(s, s.code() == StatusCode::kInvalidArgument ? "--resume"
                                                              : "agreeing on the resumed step");
    }
  }
  trainer::Trainer trainer(engine.get(), device.get(), cfg, to, &*batcher);
  if (engine->ResumedStep() == 0) {
    if (Status s = trainer.InitWeights(init.get(), a.seed); !s.ok()) {
      return Fail(s, init ? "--init " + a.init : "initialising weights");
    }
  } else if (init) {
    std::printf("# --init %s ignored: resuming from step %lld in %s\n", a.init.c_str(),
                static_cast<long long>(engine->ResumedStep()), a.resume.c_str());
  }

  // ---- start-up report ----
  const uint64_t params = model::Gpt2NumParams(cfg);
  const PlacementReport& pl = engine->Placement();
  uint64_t state_bytes = 0;
  for (const ComponentPlacement& c : pl.components) state_bytes += c.bytes;
  const int64_t tokens_per_step = static_cast<int64_t>(a.batch) * a.seq_len * a.micro_batches;
  std::printf("# strata train: GPT-2 %d layers, d_model %d, %d heads, seq %d, vocab %d\n",
              cfg.layers, cfg.d_model, cfg.heads, a.seq_len, cfg.vocab);
  std::printf("# parameters: %llu (%s fp32); model + optimizer states: %s\n",
              static_cast<unsigned long long>(params), Bytes(params * 4.0).c_str(),
              Bytes(static_cast<double>(state_bytes)).c_str());
  std::printf("# data: %s; %lld training / %lld held-out tokens\n", data.description.c_str(),
              static_cast<long long>(batcher->train_tokens()),
              static_cast<long long>(batcher->val_tokens()));
  std::printf(
      "# batch: %d rows x %d tokens x %d micro-batches = %lld tokens/step; %lld steps; "
      "lr %g (%s, warmup %lld); %s\n",
      a.batch, a.seq_len, a.micro_batches, static_cast<long long>(tokens_per_step),
      static_cast<long long>(a.steps), a.lr, a.lr_schedule.c_str(),
      static_cast<long long>(a.warmup), a.recompute ? "recompute" : "no recompute");
  std::printf("# device: %s\n", device->Name().c_str());
  // What the engine's collectives ran on, and where; the host communicator only when it is
  // another one.
  const char* comm_backend = eo.comm ? eo.comm->backend() : "none";
  const char* host_comm_backend = comm ? comm->backend() : "none";
  // The engine resolves auto (to device or host) when there are collectives.
  const CollectiveMemory memory = pl.collective_memory;
  if (comm) {
    const std::string backends = nccl ? std::string(comm_backend) + ", host-side collectives on " +
                                            host_comm_backend + " over TCP"
                                      : std::string(comm_backend) + " over TCP";
    const std::string where =
        std::string("collectives in ") + CollectiveMemoryName(memory) + " memory";
    const std::string source =
        ri.source.empty() ? std::string("one rank") : "from " + ri.source + " variables";
    std::printf("# ranks: %d (%s; %s; %s); %d rows of each micro-batch per rank\n", ri.world_size,
                source.c_str(), backends.c_str(), where.c_str(), a.batch / ri.world_size);
  }
  // The engine's placement report: where each component lives and why ("# " lines).
  std::string placement = pl.ToString();
  for (size_t p = 0, q; p < placement.size(); p = q + 1) {
    q = placement.find('\n', p);
    if (q == std::string::npos) q = placement.size();
    const std::string line = placement.substr(p, q - p);
    if (!line.empty()) std::printf("%s%s\n", line[0] == '#' ? "" : "# ", line.c_str());
  }
  // The engine predicts the transfers; the compute side is predicted here by timing the
  // model's own GEMMs (the bulk of its FLOPs) once on this machine, per micro-batch.
  double compute_s = 0;
  if (device->Kind() == DeviceKind::kHost) {
    model::GemmRunner gemms(model::ModelGemms(cfg, a.batch, a.seq_len));
    gemms.Run();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    gemms.Run();
    compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
                a.micro_batches;
  }
  std::printf(
      "# predicted bound per step: %.4f s (%s); transfers %.4f s (%s), compute >= "
      "%.4f s (the model's GEMMs alone, timed now)\n",
      std::max(compute_s, pl.predicted_bound_seconds),
      compute_s > pl.predicted_bound_seconds ? "compute" : pl.predicted_bound_resource.c_str(),
      pl.predicted_bound_seconds, pl.predicted_bound_resource.c_str(), compute_s);
  if (engine->ResumedStep() > 0) {
    std::printf("# resumed at step %lld\n", static_cast<long long>(engine->ResumedStep()));
  }
  std::fflush(stdout);

  // ---- steps ----
  nlohmann::json js;
  js["config"] = {{"layers", cfg.layers},
                  {"d_model", cfg.d_model},
                  {"heads", cfg.heads},
                  {"seq_len", a.seq_len},
                  {"vocab", cfg.vocab},
                  {"params", params},
                  {"batch", a.batch},
                  {"micro_batches", a.micro_batches},
                  {"steps", a.steps},
                  {"lr", a.lr},
                  {"lr_schedule", a.lr_schedule},
                  {"warmup", a.warmup},
                  {"weight_decay", a.weight_decay},
                  {"beta1", a.beta1},
                  {"beta2", a.beta2},
                  {"eps", a.eps},
                  {"grad_clip", a.grad_clip},
                  {"seed", a.seed},
                  {"recompute", a.recompute},
                  {"device", device->Name()},
                  {"device_mem", eo.device_mem_bytes},
                  {"host_mem", eo.host_mem_bytes},
                  {"nvme", a.nvme},
                  {"data", data.description},
                  {"resumed_step", engine->ResumedStep()},
                  {"world_size", ri.world_size},
                  {"comm_backend", comm_backend},
                  {"host_comm_backend", host_comm_backend},
                  {"collective_memory", CollectiveMemoryName(memory)}};
  js["steps"] = nlohmann::json::array();
  const bool tty = isatty(STDOUT_FILENO);
  EdgeBytes total_bytes;
  double busy[kNumResources] = {}, total_seconds = 0;
  int64_t done = 0;
  std::vector<double> losses;
  const int64_t first = trainer.next_step();
  for (int64_t s = first; s <= a.steps; ++s) {
    auto r = trainer.Step();
    if (!r.ok()) {
      if (tty) std::printf("\n");
      return Fail(r.status(), "step " + std::to_string(s));
    }
    const StepStats& st = r->stats;
    ++done;
    losses.push_back(r->loss);
    total_seconds += st.seconds;
    total_bytes.nvme_read += st.bytes.nvme_read;
    total_bytes.nvme_write += st.bytes.nvme_write;
    total_bytes.h2d += st.bytes.h2d;
    total_bytes.d2h += st.bytes.d2h;
    total_bytes.comm += st.bytes.comm;
    for (int i = 0; i < kNumResources; ++i) busy[i] += st.busy_seconds[i];
    const double tps = st.seconds > 0 ? tokens_per_step / st.seconds : 0;
    const double eta = total_seconds / done * static_cast<double>(a.steps - s);
    js["steps"].push_back({{"step", s},
                           {"loss", r->loss},
                           {"seconds", st.seconds},
                           {"tokens_per_s", tps},
                           {"efficiency", st.efficiency},
                           {"lr", r->lr},
                           {"grad_norm", st.grad_norm},
                           {"bytes",
                            {{"nvme_read", st.bytes.nvme_read},
                             {"nvme_write", st.bytes.nvme_write},
                             {"h2d", st.bytes.h2d},
                             {"d2h", st.bytes.d2h},
                             {"comm", st.bytes.comm}}}});
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %5lld/%lld  loss %.4f  %8.0f tok/s  eff %.2f (%s)  ETA %s",
                  static_cast<long long>(s), static_cast<long long>(a.steps), r->loss, tps,
                  st.efficiency, st.bound_resource.c_str(), Duration(eta).c_str());
    if (tty) {
      const int width = 20;
      const int filled = static_cast<int>(width * s / std::max<int64_t>(1, a.steps));
      std::printf("\r[%s%s] %s\033[K", std::string(filled, '#').c_str(),
                  std::string(width - filled, ' ').c_str(), line);
    } else {
      std::printf("%s\n", line);
    }
    std::fflush(stdout);
    if (a.val_every > 0 && (s % a.val_every == 0 || s == a.steps)) {
      auto v = trainer.ValidationLoss();
      if (!v.ok()) return Fail(v.status(), "validation");
      if (tty) std::printf("\n");
      std::printf("val step %lld  loss %.4f\n", static_cast<long long>(s), *v);
      js["steps"].back()["val_loss"] = *v;
    }
  }
  if (tty && done > 0) std::printf("\n");

  // ---- where the time and the bytes went ----
  if (done > 0) {
    std::printf("# %lld steps in %.2f s (%.3f s/step)\n", static_cast<long long>(done),
                total_seconds, total_seconds / done);
    // The first step's loss against the mean of the last (up to) 10: one number that says
    // whether training worked, robust to the noise of single batches.
    const size_t tail = std::min<size_t>(10, losses.size());
    double last = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i) last += losses[i];
    last /= static_cast<double>(tail);
    std::printf("# loss: first step %.4f, mean of the last %zu steps %.4f (%+.1f%%)\n",
                losses.front(), tail, last, 100.0 * (last - losses.front()) / losses.front());
    std::printf("#%-11s %14s %14s\n", "edge", "bytes", "per_step");
    const std::pair<const char*, uint64_t> edges[] = {{"nvme_read", total_bytes.nvme_read},
                                                      {"nvme_write", total_bytes.nvme_write},
                                                      {"h2d", total_bytes.h2d},
                                                      {"d2h", total_bytes.d2h},
                                                      {"comm", total_bytes.comm}};
    for (const auto& [name, b] : edges) {
      std::printf(" %-11s %14s %14s\n", name, Bytes(static_cast<double>(b)).c_str(),
                  Bytes(static_cast<double>(b) / done).c_str());
    }
    std::printf("#%-11s %10s %10s\n", "resource", "busy_s", "busy_%");
    for (int i = 0; i < kNumResources; ++i) {
      std::printf(" %-11s %10.3f %10.1f\n", ResourceName(static_cast<Resource>(i)), busy[i],
                  total_seconds > 0 ? 100.0 * busy[i] / total_seconds : 0.0);
    }
  }

  // ---- outputs ----
  if (!a.save.empty()) {
    auto w = trainer.Weights();
    if (!w.ok()) return Fail(w.status(), "--save");
    if (lead) {
      if (Status s = model::SaveWeights(a.save, specs, *w); !s.ok()) return Fail(s, "--save");
      std::printf("# saved weights to %s\n", a.save.c_str());
    }
  }
  if (a.sample > 0) {
    auto w = trainer.Weights();
    if (!w.ok()) return Fail(w.status(), "--sample");
    const std::string prompt = "The ";
    std::vector<int32_t> p(prompt.begin(), prompt.end());
    if (cfg.vocab < 256) p = {0};
    const auto out = model::Generate(cfg, *w, p, a.sample, 0.0, a.seed);
    std::printf("sample: %s\n", Decode(out, cfg.vocab).c_str());
  }
  if (!a.json.empty() && lead) {
    std::ofstream f(a.json);
    f << js.dump(1) << "\n";
    if (!f) {
      return Fail(Status::IOError("cannot write " + a.json).WithPath(a.json), "--json");
    }
  }
  return 0;
}

}  // namespace

void AddTrain(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train a GPT-2 model through the engine; parameters and optimizer states live in device "
      "memory, pinned host memory or NVMe under the given budgets");
  // CLI11 2.1 reads a config file only for the top-level app, so the subcommand applies its
  // own: after parsing, each `key = value` of the file sets the flag --key unless the
  // command line set it (the command line wins).
  auto config = std::make_shared<std::string>();
  sub->add_option("--config", *config,
                  "Read flags from a TOML file: key = value lines, flag names without the "
                  "leading dashes (d-model = 128); an optional [train] section; the command "
                  "line wins");
  sub->add_option("--layers", a->layers, "Transformer layers")->capture_default_str();
  sub->add_option("--d-model", a->d_model, "Channels (embedding width)")->capture_default_str();
  a->heads_opt = sub->add_option("--heads", a->heads,
                                 "Attention heads (must divide --d-model; with --init the "
                                 "default is d_model/64)")
                     ->capture_default_str();
  sub->add_option("--seq-len", a->seq_len, "Tokens per row (at most wpe's rows with --init)")
      ->capture_default_str();
  sub->add_option("--vocab", a->vocab, "Vocabulary size (256 for byte-level text)")
      ->capture_default_str();
  sub->add_option("--data", a->data,
                  "Training data: a text file (byte tokens) or an llm.c uint16 token file; "
                  "default: the built-in generated corpus");
  sub->add_option("--val-every", a->val_every,
                  "Every K steps, report the loss on the held-out last 10% of the data (0: off)")
      ->capture_default_str();
  sub->add_option("--init", a->init, "Initial weights: Hugging Face GPT-2 .safetensors file");
  sub->add_option("--save", a->save, "Write the trained weights to this .safetensors file");
  sub->add_option("--resume", a->resume,
                  "Continue from the last committed step of the swap store in this folder");
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
  sub->add_option("--grad-clip", a->grad_clip, "Clip the global gradient norm (0: off)")
      ->capture_default_str();
  sub->add_option("--batch", a->batch, "Rows per micro-batch")->capture_default_str();
  sub->add_option("--micro-batches", a->micro_batches,
                  "Micro-batches per step (the gradient is their mean)")
      ->capture_default_str();
  sub->add_option("--steps", a->steps, "Optimizer steps (total, counting resumed ones)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the initialisation and of --sample")
      ->capture_default_str();
  sub->add_flag("--recompute", a->recompute,
                "Activation checkpointing: keep only each block's input, recompute in backward");
  sub->add_option("--device", a->device,
                  "auto (= cpu for now), cpu (HostDevice: fp32 on the CPU) or cuda (bf16 "
                  "kernels of model/cuda/)")
      ->capture_default_str();
  sub->add_option("--device-mem", a->device_mem,
                  "Device memory for the engine's parameter and gradient buffers (e.g. 64M; "
                  "default: unlimited)");
  sub->add_option("--host-mem", a->host_mem,
                  "Pinned host memory for states and staging (e.g. 256M; default: unlimited, "
                  "no NVMe)");
  sub->add_option("--nvme", a->nvme,
                  "Folder for NVMe-resident states (repeatable: striped); {rank} and "
                  "{local_rank} are replaced by the rank's numbers (one folder per rank)");
  sub->add_option("--rendezvous", a->rendezvous,
                  "With WORLD_SIZE > 1 (strata launch, torchrun, mpirun, srun): where the "
                  "ranks meet, file:DIR (a fresh shared folder) or redis:HOST:PORT; default "
                  "STRATA_RENDEZVOUS");
  sub->add_option("--comm-timeout", a->comm_timeout,
                  "Seconds a collective waits for a peer before the run fails naming the lost "
                  "rank; default STRATA_COMM_TIMEOUT (300)");
  sub->add_option("--comm-backend", a->comm_backend,
                  "With several ranks, what the engine's parameter all-gathers and gradient "
                  "reduce-scatters run on: gloo (TCP, host memory; works with any device), "
                  "nccl (GPU memory; needs --device cuda; with one rank it still runs them, "
                  "trivially, so one GPU exercises NCCL) or auto (nccl with --device cuda, "
                  "else gloo). Gloo always joins the ranks and carries the host-side "
                  "collectives; with --device cuda each rank uses GPU LOCAL_RANK")
      ->capture_default_str();
  sub->add_option("--collective-memory", a->collective_memory,
                  "Where the engine gathers parameters and reduces gradients across ranks: "
                  "device (in device memory: each rank copies only its 1/N of a block over "
                  "H2D and back over D2H), host (in pinned host buffers: whole blocks cross "
                  "H2D/D2H), or auto (device whenever the communicator reaches device memory: "
                  "NCCL on a GPU, Gloo on the CPU device). Same results either way")
      ->capture_default_str();
  sub->add_flag("--durable,!--no-durable", a->durable,
                "With --nvme: commit a complete state to NVMe every step (host-resident states "
                "too), so a killed run can be resumed with --resume (default on)");
  sub->add_option("--trace", a->trace, "Write a Chrome/Perfetto trace of the run to this file");
  sub->add_option("--json", a->json, "Write the configuration and per-step results as JSON");
  sub->add_option("--sample", a->sample, "After training, print this many generated tokens")
      ->capture_default_str();
  sub->callback([a, sub, config, exit_code] {
    if (!config->empty()) {
      std::vector<CLI::ConfigItem> items;
      try {
        items = CLI::ConfigTOML().from_file(*config);
      } catch (const CLI::Error& e) {
        std::fprintf(stderr, "strata train: --config %s: %s\n", config->c_str(), e.what());
        *exit_code = 1;
        return;
      }
      for (const CLI::ConfigItem& item : items) {
        if (!(item.parents.empty() || (item.parents.size() == 1 && item.parents[0] == "train"))) {
          continue;
        }
        std::string name = item.name;
        std::replace(name.begin(), name.end(), '_', '-');
        if (name == "config" || name == "++" || name == "--") continue;
        CLI::Option* opt = nullptr;
        try {
          opt = sub->get_option("--" + name);
        } catch (const CLI::Error&) {
        }
        if (opt == nullptr) {
          std::fprintf(stderr,
                       "strata train: --config %s: unknown key '%s' (keys are flag names "
                       "without the dashes, e.g. d-model)\n",
                       config->c_str(), item.name.c_str());
          *exit_code = 1;
          return;
        }
        if (opt->count() > 0) continue;  // the command line wins
        try {
          opt->add_result(item.inputs);
          opt->run_callback();
        } catch (const CLI::Error& e) {
          std::fprintf(stderr, "strata train: --config %s: %s = %s: %s\n", config->c_str(),
                       item.name.c_str(), CLI::detail::join(item.inputs).c_str(), e.what());
          *exit_code = 1;
          return;
        }
      }
    }
    *exit_code = RunTrain(*a);
  });
}

}  // namespace strata::cli
