// The flags every engine run shares; see run_flags.h.
#include "tools/strata/run_flags.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "strata/input_file.h"
#include "tools/strata/cli_common.h"

namespace strata::cli {

namespace {

// "a:b", "a:", ":b" or "a" as [first, last], 0 for an open end.
Result<std::pair<int64_t, int64_t>> ParseStepRange(const std::string& text) {
  auto fail = [&] {
    return Status::InvalidArgument("--trace-steps " + text +
                                   ": expected a:b, a:, :b or a with steps >= 1 and a <= b "
                                   "(e.g. 10:20)");
  };
  const size_t colon = text.find(':');
  const std::string a = text.substr(0, colon);
  const std::string b = colon == std::string::npos ? a : text.substr(colon + 1);
  auto number = [](const std::string& t, int64_t* v) {
    if (t.empty()) return true;
    if (t.find_first_not_of("0123456789") != std::string::npos || t.size() > 15) return false;
    *v = std::stoll(t);
    return *v >= 1;
  };
  int64_t first = 0, last = 0;
  if ((a.empty() && b.empty()) || !number(a, &first) || !number(b, &last)) return fail();
  if (last != 0 && first > last) return fail();
  return std::make_pair(first, last);
}

// The I/O settings of --io-config `path` (`strata bench io --sweep --io-config FILE`
// writes {"io": {"block_bytes", "queue_depth", "backend", "direct"}, "measured": {...}})
// into `config`; `io_given`: --io was given and wins over the file's backend.
Status ApplyIoConfig(const std::string& path, bool io_given, trainer::RunConfig* config) {
  const std::string where = "--io-config " + path;
  const std::string fix =
      "; give the file `strata bench io --sweep --io-config FILE` writes, e.g. {\"io\": "
      "{\"block_bytes\": 1048576, \"queue_depth\": 32, \"backend\": \"uring\", "
      "\"direct\": true}}";
  // The file holds a few settings; /dev/zero would be read until memory runs out.
  constexpr uint64_t kMaxIoConfigBytes = uint64_t{1} << 20;
  STRATA_ASSIGN_OR_RETURN(const std::string text,
                          ReadInputFile(path, "--io-config", kMaxIoConfigBytes));
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::InvalidArgument(where + ": not a JSON object" + fix).WithPath(path);
  }
  if (!doc.contains("io") || !doc["io"].is_object()) {
    return Status::InvalidArgument(where + ": no \"io\" object" + fix).WithPath(path);
  }
  auto bad = [&](const std::string& key, const std::string& expected) {
    return Status::InvalidArgument(where + ": io." + key + " is " + doc["io"][key].dump() +
                                   ", expected " + expected)
        .WithPath(path);
  };
  trainer::RunConfig read = *config;
  for (const auto& [key, value] : doc["io"].items()) {
    if (key == "block_bytes") {
      if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 ||
          value.get<uint64_t>() % 4096 != 0) {
        return bad(key, "a size in bytes, a multiple of 4096");
      }
      read.io_block_bytes = value.get<uint64_t>();
    } else if (key == "queue_depth") {
      if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 ||
          value.get<uint64_t>() > 4096) {
        return bad(key, "a queue depth from 1 to 4096");
      }
      read.io_queue_depth = value.get<uint32_t>();
    } else if (key == "backend") {
      auto kind = value.is_string() ? ParseIoBackendKind(value.get<std::string>())
                                    : Result<IoBackendKind>(Status::InvalidArgument(""));
      if (!kind.ok()) return bad(key, "\"uring\", \"posix\" or \"auto\"");
      if (!io_given) read.io = *kind;
    } else if (key == "direct" || key == "fixed_buffers") {
      if (!value.is_boolean()) return bad(key, "true or false");
      (key == "direct" ? read.io_direct : read.io_fixed_buffers) = value.get<bool>();
    } else {
      return Status::InvalidArgument(where + ": unknown setting io." + key +
                                     " (known: block_bytes, queue_depth, backend, direct, "
                                     "fixed_buffers)")
          .WithPath(path);
    }
  }
  *config = read;
  return Status::OK();
}

// Where the engine runs and what it may hold: the device and the memory budgets.
void AddPlacementFlags(CLI::App* cmd, RunFlags* f, const std::string& nvme_help) {
  cmd->add_option("--device", f->device,
                  "auto (CUDA when a GPU is present at run time, else the host device; the "
                  "start-up report says which), cpu (the host device: fp32 on the CPU) or "
                  "cuda (GPU LOCAL_RANK; the model in bf16 kernels)")
      ->capture_default_str();
  cmd->add_option("--device-mem", f->device_mem,
                  "Device memory for the engine's parameter and gradient buffers (e.g. 64M, "
                  "or unlimited: the default)");
  cmd->add_option("--host-mem", f->host_mem,
                  "Pinned host memory for states and staging (e.g. 256M, or unlimited: the "
                  "default, every state stays in host memory)");
  cmd->add_option("--nvme", f->nvme, nvme_help);
}

// How a step is ordered: micro-batches, activations, clipping, the pipelined boundary.
void AddScheduleFlags(CLI::App* cmd, RunFlags* f) {
  cmd->add_option("--micro-batches", f->micro_batches,
                  "Micro-batches per step (the gradient is their mean)")
      ->capture_default_str();
  cmd->add_option("--micro-batch-order", f->micro_batch_order,
                  "auto, layer or batch: layer runs every micro-batch through a block before "
                  "the next (params cross once per pass, gradients sum on the device; the "
                  "activations of every micro-batch count in --device-mem, or live in the "
                  "engine: --offload-activations), batch one micro-batch after another; auto "
                  "takes layer when it fits or moves fewer bytes, and where it needs "
                  "recompute turned on, only when that costs less time than batch-major's "
                  "weight traffic (timed on the host device). Same results")
      ->capture_default_str();
  cmd->add_option("--offload-activations", f->offload_activations,
                  "auto, on or off: in layer-major order, the micro-batches the device has no "
                  "room for share one activation slot and their block inputs live in the "
                  "engine (pinned host memory, else NVMe, within --host-mem), moved out and "
                  "back per block; needs recompute (turned on unless --no-recompute). auto "
                  "does it when it moves fewer bytes than batch-major's weight reloads. Same "
                  "results")
      ->capture_default_str();
  cmd->add_option("--grad-clip", f->grad_clip, "Clip the global gradient norm (0: off)")
      ->capture_default_str();
  cmd->add_option("--speculate", f->speculate,
                  "With --grad-clip: auto, on or off. on runs each block's optimizer step "
                  "during backward, before the global norm is known, and redoes the blocks "
                  "from their committed NVMe versions when clipping (or a non-finite "
                  "gradient) applies: same results, no serial tail; off waits for the norm; "
                  "auto speculates unless the last step clipped. Blocks whose states live in "
                  "host memory without --durable always wait")
      ->capture_default_str();
  cmd->add_option("--pipeline", f->pipeline,
                  "With --grad-clip: on or off. on runs the optimizer steps that wait for "
                  "the global norm under the next step's forward, in the order it needs the "
                  "blocks, and commits the step during it: same results, no serial tail; "
                  "off runs them at the end of the step. One rank")
      ->capture_default_str();
  cmd->add_option("--grad-spill", f->grad_spill,
                  "With --grad-clip and --nvme: auto, on or off. on writes each gradient to "
                  "NVMe when final, so host memory need not hold every gradient until the "
                  "norm is known (a lower --host-mem minimum, more NVMe writes); auto does "
                  "so when --host-mem cannot hold them")
      ->capture_default_str();
}

// The formats of the states and of the gradients.
void AddPrecisionFlags(CLI::App* cmd, RunFlags* f) {
  cmd->add_option(
         "--state-dtype", f->state_dtype,
         "The Adam moments in host memory and on NVMe: fp32, or bf16 (8 bytes of "
         "state per parameter instead of 12, a third less NVMe traffic for them; "
         "the master weights as --master-dtype says; rounded stochastically) or bf16-rne (rounded "
         "to nearest even, for comparison: it loses exp_avg_sq's small steps) or int8 "
         "(8-bit codes with an fp32 scale per block of 2048 values: about 6 bytes of "
         "state per parameter, rounded to nearest)")
      ->capture_default_str();
  cmd->add_option("--master-dtype", f->master_dtype,
                  "The master weights in host memory and on NVMe: fp32, or bf16 (2 bytes per "
                  "parameter instead of 4, rounded stochastically; they are the device's bf16 "
                  "params, so no separate copy: with --state-dtype int8 about 4 bytes of state "
                  "per parameter, a third of fp32's NVMe traffic). Needs the bf16 working dtype "
                  "(strata train: --device cuda); recorded, and a resume must use the same")
      ->capture_default_str();
  cmd->add_option("--grad-dtype", f->grad_dtype,
                  "Gradients from the device to the host: fp32, or bf16 (rounded to nearest "
                  "even on the device: half the D2H bytes; the host accumulates and steps in "
                  "fp32). With ranks the gradients reduce in host memory (--collective-memory "
                  "auto picks host; device, or --comm-backend nccl, is refused); recorded, and "
                  "a resume must use the same")
      ->capture_default_str();
}

// The trace.
void AddTraceFlags(CLI::App* cmd, RunFlags* f) {
  cmd->add_option("--trace", f->trace,
                  "Write a Chrome/Perfetto trace of the run to this file ({rank} and "
                  "{local_rank} are replaced by the rank's numbers)");
  cmd->add_option("--trace-steps", f->trace_steps,
                  "Trace only these steps: a:b (inclusive), a: (from a), :b (up to b) or a "
                  "(one step); default every step");
}

// The NVMe I/O settings.
void AddIoFlags(CLI::App* cmd, RunFlags* f) {
  f->io_option =
      cmd->add_option("--io", f->io, "NVMe backend: auto (io_uring, else posix), uring or posix")
          ->capture_default_str();
  cmd->add_option("--io-config", f->io_config,
                  "The NVMe I/O settings (request size, queue depth, backend, O_DIRECT) from "
                  "FILE, as `strata bench io --sweep --io-config FILE` writes it; --io and "
                  "--io-block win over it");
  cmd->add_option("--io-block", f->io_block,
                  "NVMe request size, the swap store's stripe (a multiple of 4K, e.g. 1M; "
                  "fixed for the store's life); default --io-config's, else 1M");
}

// The CPU threads.
void AddThreadFlags(CLI::App* cmd, RunFlags* f) {
  cmd->add_option("--threads", f->cpu_threads,
                  "Threads for the CPU work: the optimizer and, on the host device, the model "
                  "(0: STRATA_NUM_THREADS when set, else one per core)")
      ->capture_default_str();
  cmd->add_option("--optimizer-threads", f->optimizer_threads,
                  "Threads for the CPU optimizer alone (0: as --threads). On the host device "
                  "the model's and the optimizer's OpenMP teams share the CPUs; with more "
                  "threads in all than CPUs libgomp's idle workers sleep between operators. 1 "
                  "keeps the model's workers spinning: faster on an idle machine, slower "
                  "beside other busy processes (bench/PERFORMANCE.md)")
      ->capture_default_str();
}

// Several ranks: where they meet and what their collectives run on.
}  // namespace

void AddRunSecretFlags(CLI::App* cmd, std::string* secret, std::string* file) {
  cmd->add_option("--run-secret", *secret,
                  "With several ranks, the run's secret: every rank signs its rendezvous keys "
                  "with it and ignores keys that do not verify; default STRATA_RUN_SECRET "
                  "(strata launch sets it). Shows in ps: prefer --run-secret-file or the "
                  "variable");
  cmd->add_option("--run-secret-file", *file,
                  "The run's secret, read from this file (readable by its owner alone: chmod "
                  "600), so that it shows neither in ps nor in the environment");
}

namespace {

void AddRankFlags(CLI::App* cmd, RunFlags* f) {
  cmd->add_option(
      "--rendezvous", f->rendezvous,
      "With WORLD_SIZE > 1 (strata launch, torchrun, mpirun, srun): where the "
      "ranks meet, file:DIR (a fresh shared folder) or redis://HOST:PORT/PREFIX; default "
      "STRATA_RENDEZVOUS");
  cmd->add_option("--comm-timeout", f->comm_timeout,
                  "Seconds a collective waits for a peer before the run fails naming the lost "
                  "rank; default STRATA_COMM_TIMEOUT (300)");
  AddRunSecretFlags(cmd, &f->run_secret, &f->run_secret_file);
  cmd->add_option("--comm-backend", f->comm_backend,
                  "With several ranks, what the engine's parameter all-gathers and gradient "
                  "reduce-scatters run on: gloo (TCP, host memory; works with any device), "
                  "nccl (GPU memory; needs a CUDA device; with one rank it still runs them, "
                  "trivially, so one GPU exercises NCCL) or auto (nccl on a CUDA device, "
                  "else gloo). Gloo always joins the ranks and carries "
                  "the host-side "
                  "collectives; on CUDA each rank uses GPU LOCAL_RANK")
      ->capture_default_str();
  cmd->add_option("--collective-memory", f->collective_memory,
                  "Where the engine gathers parameters and reduces gradients across ranks: "
                  "device (in device memory: each rank copies only its 1/N of a block over "
                  "H2D and back over D2H), host (in pinned host buffers: whole blocks cross "
                  "H2D/D2H), or auto (device whenever the communicator reaches device memory: "
                  "NCCL on a GPU, Gloo on the CPU device; host with --grad-dtype bf16). Same "
                  "results either way")
      ->capture_default_str();
}

}  // namespace

void AddRunFlags(CLI::App* cmd, RunFlags* f, const std::string& nvme_help) {
  AddPlacementFlags(cmd, f, nvme_help);
  AddScheduleFlags(cmd, f);
  AddPrecisionFlags(cmd, f);
  AddTraceFlags(cmd, f);
  AddIoFlags(cmd, f);
  AddThreadFlags(cmd, f);
  AddRankFlags(cmd, f);
}

namespace {

// Where the ranks meet and with which secret (checked when they join: comm/join.h).
void ApplyRankFlags(const RunFlags& f, trainer::RunConfig* config) {
  config->rendezvous = f.rendezvous;
  config->comm_timeout_seconds = f.comm_timeout;
  config->run_secret = f.run_secret;
  config->run_secret_file = f.run_secret_file;
}

// --state-dtype, --master-dtype and --grad-dtype.
Status ApplyPrecisionFlags(const RunFlags& f, trainer::RunConfig* config, std::string* failed) {
  auto fail = [&](const char* flag, Status s) {
    *failed = flag;
    return s;
  };
  if (f.state_dtype == "fp32") {
    config->state_format = StateFormat::kFp32;
  } else if (f.state_dtype == "bf16" || f.state_dtype == "bf16-rne") {
    config->state_format = StateFormat::kBf16;
    config->state_rounding =
        f.state_dtype == "bf16" ? StateRounding::kStochastic : StateRounding::kNearestEven;
  } else if (f.state_dtype == "int8") {
    config->state_format = StateFormat::kInt8;
    config->state_rounding = StateRounding::kNearestEven;
  } else {
    return fail("--state-dtype",
                Status::InvalidArgument("--state-dtype " + f.state_dtype +
                                        ": expected fp32, bf16, bf16-rne or int8"));
  }
  if (f.master_dtype == "fp32" || f.master_dtype == "bf16") {
    config->master_format =
        f.master_dtype == "bf16" ? MasterFormat::kBf16Stochastic : MasterFormat::kFp32;
  } else {
    return fail("--master-dtype", Status::InvalidArgument("--master-dtype " + f.master_dtype +
                                                          ": expected fp32 or bf16"));
  }
  if (f.grad_dtype == "fp32" || f.grad_dtype == "bf16") {
    config->grad_dtype = f.grad_dtype == "bf16" ? GradDtype::kBf16 : GradDtype::kFp32;
  } else {
    return fail("--grad-dtype", Status::InvalidArgument("--grad-dtype " + f.grad_dtype +
                                                        ": expected fp32 or bf16"));
  }
  return Status::OK();
}

}  // namespace

Status ApplyRunFlags(const RunFlags& f, trainer::RunConfig* config, std::string* failed) {
  auto fail = [&](const char* flag, Status s) {
    *failed = flag;
    return s;
  };
  auto device = trainer::ParseDeviceChoice(f.device);
  if (!device.ok()) return fail("--device", device.status());
  config->device = *device;
  auto backend = trainer::ParseCommBackendChoice(f.comm_backend);
  if (!backend.ok()) return fail("--comm-backend", backend.status());
  config->comm_backend = *backend;
  auto memory = trainer::ParseCollectiveMemory(f.collective_memory);
  if (!memory.ok()) return fail("--collective-memory", memory.status());
  config->collective_memory = *memory;
  for (auto [flag, text, out] :
       {std::tuple{"--device-mem", &f.device_mem, &config->device_mem_bytes},
        std::tuple{"--host-mem", &f.host_mem, &config->host_mem_bytes}}) {
    if (text->empty()) continue;
    auto b = ParseBudget(flag, *text);
    if (!b.ok()) return fail(flag, b.status());
    *out = *b;
  }
  auto io = ParseIoBackendKind(f.io);
  if (!io.ok()) return fail("--io", io.status());
  config->io = *io;
  if (!f.io_config.empty()) {
    const bool io_given = f.io_option != nullptr && f.io_option->count() > 0;
    Status s = ApplyIoConfig(f.io_config, io_given, config);
    if (!s.ok()) return fail("--io-config", s);
  }
  if (!f.io_block.empty()) {
    auto b = ParseBytes("--io-block", f.io_block);
    if (!b.ok()) return fail("--io-block", b.status());
    if (*b == 0 || *b % 4096 != 0) {
      return fail("--io-block", Status::InvalidArgument("--io-block " + f.io_block +
                                                        ": expected a multiple of 4K, e.g. 1M"));
    }
    config->io_block_bytes = *b;
  }
  if (f.micro_batches < 1) {
    return fail("--micro-batches", Status::InvalidArgument("--micro-batches must be >= 1"));
  }
  config->nvme = f.nvme;
  config->micro_batches = f.micro_batches;
  {
    auto order = trainer::ParseMicroBatchOrder(f.micro_batch_order);
    if (!order.ok()) return fail("--micro-batch-order", order.status());
    config->micro_batch_order = *order;
    auto offload = trainer::ParseOffloadActivations(f.offload_activations);
    if (!offload.ok()) return fail("--offload-activations", offload.status());
    config->offload_activations = *offload;
  }
  config->grad_clip = f.grad_clip;
  const auto tri = [](const std::string& v) -> std::optional<int> {
    if (v == "auto") return 0;
    if (v == "on") return 1;
    if (v == "off") return 2;
    return std::nullopt;
  };
  if (!tri(f.speculate)) {
    return fail("--speculate", Status::InvalidArgument("--speculate " + f.speculate +
                                                       ": expected auto, on or off"));
  }
  config->speculation = Speculation(*tri(f.speculate));
  if (!tri(f.grad_spill)) {
    return fail("--grad-spill", Status::InvalidArgument("--grad-spill " + f.grad_spill +
                                                        ": expected auto, on or off"));
  }
  config->grad_spill = GradSpill(*tri(f.grad_spill));
  if (f.pipeline != "on" && f.pipeline != "off") {
    return fail("--pipeline",
                Status::InvalidArgument("--pipeline " + f.pipeline + ": expected on or off"));
  }
  config->pipeline_updates = f.pipeline == "on";
  STRATA_RETURN_IF_ERROR(ApplyPrecisionFlags(f, config, failed));
  config->trace = f.trace;
  if (!f.trace_steps.empty()) {
    auto range = ParseStepRange(f.trace_steps);
    if (!range.ok()) return fail("--trace-steps", range.status());
    config->trace_first_step = range->first;
    config->trace_last_step = range->second;
  }
  if (f.cpu_threads < 0 || f.cpu_threads > kMaxThreads) {
    return fail("--threads",
                Status::InvalidArgument("--threads " + std::to_string(f.cpu_threads) +
                                        ": expected a thread count from 0 (one per core) to " +
                                        std::to_string(kMaxThreads)));
  }
  config->cpu_threads = f.cpu_threads;
  if (f.optimizer_threads < 0 || f.optimizer_threads > kMaxThreads) {
    return fail(
        "--optimizer-threads",
        Status::InvalidArgument("--optimizer-threads " + std::to_string(f.optimizer_threads) +
                                ": expected a thread count from 0 (as --threads) to " +
                                std::to_string(kMaxThreads)));
  }
  config->optimizer_threads = f.optimizer_threads;
  ApplyRankFlags(f, config);
  failed->clear();
  return Status::OK();
}

}  // namespace strata::cli
