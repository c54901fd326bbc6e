// The flags every engine run shares; see run_flags.h.
#include "tools/strata/run_flags.h"

#include <cstdint>
#include <string>
#include <utility>

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

}  // namespace

void AddRunFlags(CLI::App* cmd, RunFlags* f, const std::string& nvme_help) {
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
  cmd->add_option("--micro-batches", f->micro_batches,
                  "Micro-batches per step (the gradient is their mean, accumulated on the host)")
      ->capture_default_str();
  cmd->add_option("--grad-clip", f->grad_clip, "Clip the global gradient norm (0: off)")
      ->capture_default_str();
  cmd->add_option("--trace", f->trace,
                  "Write a Chrome/Perfetto trace of the run to this file ({rank} and "
                  "{local_rank} are replaced by the rank's numbers)");
  cmd->add_option("--trace-steps", f->trace_steps,
                  "Trace only these steps: a:b (inclusive), a: (from a), :b (up to b) or a "
                  "(one step); default every step");
  cmd->add_option("--io", f->io, "NVMe backend: auto (io_uring, else posix), uring or posix")
      ->capture_default_str();
  cmd->add_option("--threads", f->cpu_threads,
                  "Threads for the CPU work: the optimizer and, on the host device, the model "
                  "(0: STRATA_NUM_THREADS when set, else one per core)")
      ->capture_default_str();
  cmd->add_option("--rendezvous", f->rendezvous,
                  "With WORLD_SIZE > 1 (strata launch, torchrun, mpirun, srun): where the "
                  "ranks meet, file:DIR (a fresh shared folder) or redis:HOST:PORT; default "
                  "STRATA_RENDEZVOUS");
  cmd->add_option("--comm-timeout", f->comm_timeout,
                  "Seconds a collective waits for a peer before the run fails naming the lost "
                  "rank; default STRATA_COMM_TIMEOUT (300)");
  cmd->add_option("--comm-backend", f->comm_backend,
                  "With several ranks, what the engine's parameter all-gathers and gradient "
                  "reduce-scatters run on: gloo (TCP, host memory; works with any device), "
                  "nccl (GPU memory; needs a CUDA device; with one rank it still runs them, "
                  "trivially, so one GPU exercises NCCL) or auto (nccl on a CUDA device, "
                  "else gloo). Gloo always joins the ranks and carries the host-side "
                  "collectives; on CUDA each rank uses GPU LOCAL_RANK")
      ->capture_default_str();
  cmd->add_option("--collective-memory", f->collective_memory,
                  "Where the engine gathers parameters and reduces gradients across ranks: "
                  "device (in device memory: each rank copies only its 1/N of a block over "
                  "H2D and back over D2H), host (in pinned host buffers: whole blocks cross "
                  "H2D/D2H), or auto (device whenever the communicator reaches device memory: "
                  "NCCL on a GPU, Gloo on the CPU device). Same results either way")
      ->capture_default_str();
}

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
  // An empty budget (the default) is unlimited, as is the word; 0 is refused.
  if (!f.device_mem.empty()) {
    auto b = ParseBudget("--device-mem", f.device_mem);
    if (!b.ok()) return fail("--device-mem", b.status());
    config->device_mem_bytes = *b;
  }
  if (!f.host_mem.empty()) {
    auto b = ParseBudget("--host-mem", f.host_mem);
    if (!b.ok()) return fail("--host-mem", b.status());
    config->host_mem_bytes = *b;
  }
  auto io = ParseIoBackendKind(f.io);
  if (!io.ok()) return fail("--io", io.status());
  config->io = *io;
  if (f.micro_batches < 1) {
    return fail("--micro-batches", Status::InvalidArgument("--micro-batches must be >= 1"));
  }
  config->nvme = f.nvme;
  config->micro_batches = f.micro_batches;
  config->grad_clip = f.grad_clip;
  config->trace = f.trace;
  if (!f.trace_steps.empty()) {
    auto range = ParseStepRange(f.trace_steps);
    if (!range.ok()) return fail("--trace-steps", range.status());
    config->trace_first_step = range->first;
    config->trace_last_step = range->second;
  }
  config->cpu_threads = f.cpu_threads;
  config->rendezvous = f.rendezvous;
  config->comm_timeout_seconds = f.comm_timeout;
  failed->clear();
  return Status::OK();
}

}  // namespace strata::cli
