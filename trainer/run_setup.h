// One run-setup path for everything that runs the engine: `strata train`, `strata bench
// step`, the tests and language bindings. RunConfig holds the settings a run shares, with
// their one set of defaults; RunSetup turns it into this rank's identity, the joined ranks
// (Gloo, and NCCL for the engine's collectives on a GPU), the device, and EngineOptions.
//
// The device rule, the same everywhere: --device auto is the CUDA device when a GPU is
// present at run time, otherwise the host device (HostDevice); cpu and cuda force one.
// DeviceNote() says which auto picked, for the start-up report.
//
// Errors name the flag (in the CLI's language) through `failed`, the step that failed
// ("--device", "--comm-backend", "--rendezvous", "joining the other ranks", ...), which a
// subcommand prints before the Status. Nothing here prints.
//
// Thread safety: a RunSetup belongs to the thread that drives the run. It owns the device
// and the communicators; the engine made from EngineOptions() must be destroyed first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/join.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/io.h"
#include "strata/status.h"
#include "trainer/micro_batch_order.h"

namespace strata::trainer {

enum class DeviceChoice : uint8_t { kAuto, kCpu, kCuda };
enum class CommBackendChoice : uint8_t { kAuto, kGloo, kNccl };

// --device: auto, cpu or cuda. InvalidArgument "--device <text>: expected auto, cpu or cuda".
Result<DeviceChoice> ParseDeviceChoice(std::string_view text);
const char* DeviceChoiceName(DeviceChoice choice);
// --comm-backend: auto, gloo or nccl. InvalidArgument "--comm-backend <text>: expected auto,
// gloo or nccl".
Result<CommBackendChoice> ParseCommBackendChoice(std::string_view text);
const char* CommBackendChoiceName(CommBackendChoice choice);
// --collective-memory: auto, device or host. InvalidArgument "--collective-memory <text>:
// expected auto, device or host".
Result<CollectiveMemory> ParseCollectiveMemory(std::string_view text);

// The settings every run shares, with the defaults of `strata train` (the main job): `strata
// bench step` models a training step, so it measures with the same ones.
struct RunConfig {
  DeviceChoice device = DeviceChoice::kAuto;
  uint64_t device_mem_bytes = 0;  // the engine's device budget; 0 = unlimited
  // Also cap every allocation on the device at device_mem_bytes (DeviceOptions): `bench
  // step`, whose device holds nothing but the engine's buffers. `train` does not: its
  // model's activations live on the device too, outside the engine's budget.
  bool cap_device_allocations = false;
  uint64_t host_mem_bytes = 0;  // pinned host budget; 0 = unlimited
  // NVMe folders; {rank} and {local_rank} are replaced by this rank's numbers.
  std::vector<std::string> nvme;
  std::string resume;   // folder to resume from (one of nvme, or nvme itself when empty)
  bool durable = true;  // with nvme: commit a complete state every step
  IoBackendKind io = IoBackendKind::kAuto;
  // The NVMe requests (--io-config, --io-block): their size, which is the swap store's
  // stripe and fixed for the store's life (0: the engine's default), how many are in flight
  // (0: the engine's default), O_DIRECT, and io_uring registered buffers.
  uint64_t io_block_bytes = 0;
  uint32_t io_queue_depth = 0;
  bool io_direct = IoBackendOptions{}.direct;
  bool io_fixed_buffers = IoBackendOptions{}.fixed_buffers;
  // --threads: OpenMP threads of the CPU optimizer and, on the host device, of the model's
  // ops; 0 = STRATA_NUM_THREADS when set, else one per core.
  int cpu_threads = 0;
  // --optimizer-threads: the CPU optimizer's alone; 0 = cpu_threads.
  int optimizer_threads = 0;
  int micro_batches = 1;
  // How a step runs its micro-batches (micro_batch_order.h); the same results either way.
  MicroBatchOrderChoice micro_batch_order = MicroBatchOrderChoice::kAuto;
  // Layer-major's activations in the engine when the device has no room for them
  // (micro_batch_order.h); the same results either way.
  OffloadActivations offload_activations = OffloadActivations::kAuto;
  // AdamW. weight_decay applies to tensors marked for it.
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;                        // global gradient-norm clip; 0 = off
  Speculation speculation = Speculation::kAuto;  // with clipping (EngineOptions)
  GradSpill grad_spill = GradSpill::kAuto;       // with clipping and NVMe (EngineOptions)
  // With clipping: the updates that wait for the norm run under the next step's forward
  // (EngineOptions::pipeline_updates); the same results either way.
  bool pipeline_updates = true;
  // The Adam moments' format in host memory and on NVMe (master weights stay fp32) and, for
  // bf16, their rounding (see StateFormat, StateRounding in strata/optim.h).
  StateFormat state_format = StateFormat::kFp32;
  StateRounding state_rounding = StateRounding::kStochastic;
  // With resume: moments committed in another format are converted (--allow-state-dtype-change).
  bool convert_state_format = false;
  // The master weights' format (EngineOptions::master_format; --master-dtype).
  MasterFormat master_format = MasterFormat::kFp32;
  GradDtype grad_dtype = GradDtype::kFp32;  // gradients device -> host (EngineOptions)
  std::string trace;                        // Chrome trace file; {rank}/{local_rank} replaced
  // The steps the trace records, 1-based and inclusive; 0 = unbounded.
  int64_t trace_first_step = 0, trace_last_step = 0;
  // Ranks (several under a launcher: torchrun, mpirun, srun, strata launch).
  std::string rendezvous;           // file:DIR or redis://HOST:PORT/PREFIX; "" = STRATA_RENDEZVOUS
  double comm_timeout_seconds = 0;  // 0 = STRATA_COMM_TIMEOUT
  // The run secret (comm/join.h JoinOptions): a value or a file; both "" = STRATA_RUN_SECRET.
  // Never written to the run record.
  std::string run_secret, run_secret_file;
  CommBackendChoice comm_backend = CommBackendChoice::kAuto;
  CollectiveMemory collective_memory = CollectiveMemory::kAuto;
  // Rows per micro-batch that the ranks split (each takes batch/WORLD_SIZE); 0 = the run
  // has no rows to split (bench step). Must be a multiple of the world size.
  int batch = 0;
};

// What a subcommand calls its rendezvous keys and its one-rank rendezvous folder.
struct RunNames {
  std::string store_prefix;            // "strata-train"
  std::string one_rank_folder_prefix;  // "/tmp/strata-train-rdzv-"
};

class RunSetup {
 public:
  // Checks the settings that decide the collectives (before any rank joins the others) and
  // discovers this rank from the launcher's environment (one rank without one).
  // Errors (with *failed): "--comm-backend" (nccl with --device cpu, or auto finding no
  // GPU), "rank environment" (inconsistent launcher variables), "--batch" (not a multiple
  // of the world size).
  static Result<std::unique_ptr<RunSetup>> Begin(const RunConfig& config, std::string* failed);

  // Joins the other ranks when the run needs communicators (several ranks, or
  // --comm-backend nccl on one), then opens the device (this rank's GPU LOCAL_RANK, or the
  // host device) and, on a CUDA device with --comm-backend nccl or auto, the NCCL
  // communicator for the engine's collectives. Errors (with *failed): JoinRanks' steps,
  // "--device cuda (GPU n...)", "host device", "--comm-backend nccl: joining the other
  // ranks' GPUs".
  Status Start(const RunNames& names, std::string* failed);

  // The engine's options from the config: the device and budgets, this rank's NVMe folders
  // and trace file, resume, the optimizer, and the communicators. Call after Start. Makes
  // each of this rank's --nvme folders when missing. Errors (with *failed): "--resume" when
  // the folder is not one of the --nvme folders; "--nvme" when a folder cannot be made.
  // `made` (when given) gets the folders that did not exist and were made, so that a
  // mistyped path is told rather than silently filled.
  Result<EngineOptions> MakeEngineOptions(std::string* failed,
                                          std::vector<std::string>* made = nullptr) const;

  const RunConfig& config() const { return config_; }
  const RankInfo& rank() const { return rank_; }
  // After Start:
  Device& device() const { return *device_; }
  // The Gloo communicator (host memory): the trainer's own collectives and the engine's
  // host-side ones. nullptr: one rank, no collectives.
  Communicator* host_comm() const { return ranks_.gloo.get(); }
  // What carries the engine's collectives: NCCL when made, else Gloo (or nullptr).
  Communicator* engine_comm() const { return nccl_ ? nccl_.get() : host_comm(); }
  bool nccl() const { return nccl_ != nullptr; }
  // How --device was resolved: "--device auto: a GPU is present" / "--device auto: no GPU,
  // the host device"; "" when --device named the device.
  const std::string& DeviceNote() const { return device_note_; }

 private:
  RunSetup() = default;

  RunConfig config_;
  RankInfo rank_;
  // Destroyed in reverse order: the NCCL communicator (on the device's comm stream) before
  // the device, and both before the Gloo ranks it met through.
  JoinedRanks ranks_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> nccl_;
  std::string device_note_;
};

}  // namespace strata::trainer
