// The run set-up every entry point shares; see run_setup.h.
#include "trainer/run_setup.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "strata/env.h"

namespace strata::trainer {

Result<DeviceChoice> ParseDeviceChoice(std::string_view text) {
  for (DeviceChoice c : {DeviceChoice::kAuto, DeviceChoice::kCpu, DeviceChoice::kCuda}) {
    if (text == DeviceChoiceName(c)) return c;
  }
  return Status::InvalidArgument("--device " + std::string(text) + ": expected auto, cpu or cuda");
}

const char* DeviceChoiceName(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::kAuto:
      return "auto";
    case DeviceChoice::kCpu:
      return "cpu";
    case DeviceChoice::kCuda:
      return "cuda";
  }
  return "?";
}

Result<CommBackendChoice> ParseCommBackendChoice(std::string_view text) {
  for (CommBackendChoice c :
       {CommBackendChoice::kAuto, CommBackendChoice::kGloo, CommBackendChoice::kNccl}) {
    if (text == CommBackendChoiceName(c)) return c;
  }
  return Status::InvalidArgument("--comm-backend " + std::string(text) +
                                 ": expected auto, gloo or nccl");
}

const char* CommBackendChoiceName(CommBackendChoice choice) {
  switch (choice) {
    case CommBackendChoice::kAuto:
      return "auto";
    case CommBackendChoice::kGloo:
      return "gloo";
    case CommBackendChoice::kNccl:
      return "nccl";
  }
  return "?";
}

Result<CollectiveMemory> ParseCollectiveMemory(std::string_view text) {
  for (CollectiveMemory m :
       {CollectiveMemory::kAuto, CollectiveMemory::kDevice, CollectiveMemory::kHost}) {
    if (text == CollectiveMemoryName(m)) return m;
  }
  return Status::InvalidArgument("--collective-memory " + std::string(text) +
                                 ": expected auto, device or host");
}

Result<std::unique_ptr<RunSetup>> RunSetup::Begin(const RunConfig& config, std::string* failed) {
  std::string ignored;
  if (failed == nullptr) failed = &ignored;
  std::unique_ptr<RunSetup> setup(new RunSetup());
  setup->config_ = config;
  // NCCL moves GPU memory: refused before any rank joins the others when this run's device
  // cannot be a GPU.
  const bool gpu_present = config.device == DeviceChoice::kAuto && CudaAvailable();
  if (config.comm_backend == CommBackendChoice::kNccl && config.device != DeviceChoice::kCuda &&
      !gpu_present) {
    *failed = "--comm-backend";
    const bool is_auto = config.device == DeviceChoice::kAuto;
    return Status::InvalidArgument(
        std::string("--comm-backend nccl needs --device cuda (NCCL moves GPU memory), but "
                    "--device is ") +
        DeviceChoiceName(config.device) + (is_auto ? " and this machine has no GPU" : "") +
        "; pass --device cuda on a machine with a GPU, or --comm-backend gloo (or auto) for a "
        "CPU run");
  }
  auto rank = RankFromEnvOrSingle();
  if (!rank.ok()) {
    *failed = "rank environment";
    return rank.status();
  }
  setup->rank_ = *rank;
  const int world = setup->rank_.world_size;
  if (config.batch > 0 && config.batch % world != 0) {
    *failed = "--batch";
    return Status::InvalidArgument(
        "--batch " + std::to_string(config.batch) + " does not split over " +
        std::to_string(world) +
        " ranks (each rank takes batch/WORLD_SIZE rows of every micro-batch); use a multiple of " +
        std::to_string(world));
  }
  failed->clear();
  return setup;
}

Status RunSetup::Start(const RunNames& names, std::string* failed) {
  std::string ignored;
  if (failed == nullptr) failed = &ignored;
  // With one rank there are no collectives, except that --comm-backend nccl still runs the
  // engine's through a one-rank NCCL communicator, so one GPU exercises that path (its Gloo
  // partner then meets in a temporary folder).
  const bool nccl_asked = config_.comm_backend == CommBackendChoice::kNccl;
  if (rank_.world_size > 1 || nccl_asked) {
    JoinOptions jo;
    jo.rendezvous = config_.rendezvous;
    jo.timeout_seconds = config_.comm_timeout_seconds;
    jo.run_secret = config_.run_secret;
    jo.run_secret_file = config_.run_secret_file;
    jo.store_prefix = names.store_prefix;
    jo.one_rank_folder_prefix = names.one_rank_folder_prefix;
    STRATA_ASSIGN_OR_RETURN(ranks_, JoinRanks(rank_, jo, failed));
  }

  // The device: auto is the GPU when one is present at run time, else the host.
  DeviceOptions dopt;
  if (config_.cap_device_allocations) dopt.memory_budget_bytes = config_.device_mem_bytes;
  // Each rank of a host drives its own GPU: the one numbered by its local rank.
  dopt.cuda_device = rank_.local_rank;
  const bool cuda = config_.device == DeviceChoice::kCuda ||
                    (config_.device == DeviceChoice::kAuto && CudaAvailable());
  if (config_.device == DeviceChoice::kAuto) {
    device_note_ =
        cuda ? "--device auto: a GPU is present" : "--device auto: no GPU, the host device";
  }
  if (cuda) {
    auto d = CreateCudaDevice(dopt);
    if (!d.ok()) {
      *failed = std::string("--device ") + DeviceChoiceName(config_.device) + " (GPU " +
                std::to_string(rank_.local_rank) +
                (rank_.world_size > 1 ? ", this rank's local rank" : "") + ")";
      return d.status();
    }
    device_ = std::move(d).value();
  } else {
    auto d = CreateHostDevice(dopt);
    if (!d.ok()) {
      *failed = "host device";
      return d.status();
    }
    device_ = std::move(d).value();
  }

  // --threads on the host device: the model's CPU ops run on its compute lane's thread
  // (and on this one, e.g. validation), each with its own OpenMP team size.
  if (std::string bad = EnvNumThreadsError(); !bad.empty()) {
    *failed = "STRATA_NUM_THREADS";
    return Status::InvalidArgument(bad);
  }
  const int threads = config_.cpu_threads > 0 ? config_.cpu_threads : EnvNumThreads();
  if (threads > 0 && device_->Kind() == DeviceKind::kHost) {
    omp_set_num_threads(threads);
    Status s = device_->EnqueueHostFunction(
        Lane::kCompute,
        [threads] {
          omp_set_num_threads(threads);
          return Status::OK();
        },
        "set threads");
    if (s.ok()) s = device_->SynchronizeLane(Lane::kCompute);
    if (!s.ok()) {
      *failed = "--threads";
      return s;
    }
  }

  // NCCL joins the engine's collectives on a CUDA device; Gloo always carries the trainer's
  // own collectives and the engine's host-side ones.
  auto n = CreateEngineNccl(ranks_, CommBackendChoiceName(config_.comm_backend), *device_);
  if (!n.ok()) {
    *failed = "--comm-backend nccl: joining the other ranks' GPUs";
    return n.status();
  }
  nccl_ = std::move(n).value();
  failed->clear();
  return Status::OK();
}

Result<EngineOptions> RunSetup::MakeEngineOptions(std::string* failed,
                                                  std::vector<std::string>* made) const {
  std::string ignored;
  if (failed == nullptr) failed = &ignored;
  EngineOptions eo;
  eo.device = device_.get();
  eo.device_mem_bytes = config_.device_mem_bytes;
  eo.host_mem_bytes = config_.host_mem_bytes;
  for (const std::string& p : config_.nvme) {
    eo.nvme_paths.push_back(RankPath(p, rank_));
    // A missing --nvme folder (this rank's, with {rank}) is made, parents too.
    std::error_code ec;
    const bool created = std::filesystem::create_directories(eo.nvme_paths.back(), ec);
    if (created && made != nullptr) made->push_back(eo.nvme_paths.back());
    if (ec) {
      *failed = "--nvme";
      return Status::IOError("--nvme " + eo.nvme_paths.back() + ": cannot create the folder (" +
                             ec.message() + "); pass a folder you can write to")
          .WithPath(eo.nvme_paths.back());
    }
  }
  if (!config_.resume.empty()) {
    const std::string resume = RankPath(config_.resume, rank_);
    eo.resume = true;
    if (eo.nvme_paths.empty()) {
      eo.nvme_paths = {resume};
    } else if (std::find(eo.nvme_paths.begin(), eo.nvme_paths.end(), resume) ==
               eo.nvme_paths.end()) {
      *failed = "--resume";
      return Status::InvalidArgument("--resume " + resume +
                                     " is not one of the --nvme folders; pass the folder that "
                                     "holds the swap store");
    }
  }
  eo.io.kind = config_.io;
  if (config_.io_queue_depth > 0) eo.io.queue_depth = config_.io_queue_depth;
  eo.io.direct = config_.io_direct;
  eo.io.fixed_buffers = config_.io_fixed_buffers;
  if (config_.io_block_bytes > 0) eo.nvme_stripe_bytes = config_.io_block_bytes;
  eo.optimizer_threads =
      config_.optimizer_threads > 0 ? config_.optimizer_threads : config_.cpu_threads;
  eo.beta1 = config_.beta1;
  eo.beta2 = config_.beta2;
  eo.eps = config_.eps;
  eo.weight_decay = config_.weight_decay;
  eo.grad_clip = config_.grad_clip;
  eo.speculation = config_.speculation;
  eo.grad_spill = config_.grad_spill;
  eo.pipeline_updates = config_.pipeline_updates;
  eo.state_format = config_.state_format;
  eo.state_rounding = config_.state_rounding;
  eo.convert_state_format = config_.convert_state_format;
  eo.master_format = config_.master_format;
  eo.grad_dtype = config_.grad_dtype;
  eo.micro_batches = config_.micro_batches;
  eo.trace_path = RankPath(config_.trace, rank_);
  // Each rank's trace names its rank, under its own pid (traces opened together stay apart).
  eo.trace_pid = rank_.rank + 1;
  eo.trace_process_name = rank_.world_size > 1 ? "strata rank " + std::to_string(rank_.rank) +
                                                     " of " + std::to_string(rank_.world_size)
                                               : "strata";
  eo.trace_first_step = config_.trace_first_step;
  eo.trace_last_step = config_.trace_last_step;
  eo.comm = engine_comm();
  eo.host_comm = nccl_ ? host_comm() : nullptr;  // nullptr: eo.comm (Gloo) does both
  eo.collective_memory = config_.collective_memory;
  eo.durable = config_.durable && !eo.nvme_paths.empty();
  failed->clear();
  return eo;
}

}  // namespace strata::trainer
