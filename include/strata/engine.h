// Engine: the swap scheduler. It holds a model's training state (parameters, fp32 master
// weights, Adam moments, gradients) across three tiers — device memory, pinned host memory
// and NVMe — under hard per-tier budgets, hands the model each block's parameters on the
// device when it needs them, takes the block's gradients back, and runs the CPU AdamW step
// of every block as soon as that block's gradient is final, overlapped with the rest of
// backward.
//
// Data model (docs/design.md "Data model"): a model is an ordered list of blocks (a transformer
// layer, the embeddings, ...), each a list of named tensors. A block's tensors are flattened
// into one flat buffer, each tensor starting at a multiple of `tensor_alignment` elements,
// and the flat buffer is padded so it splits into `world_size` equal shards (rank r owns
// shard r and keeps only that shard's states, in its own host budget and NVMe paths; the
// device gets whole blocks, all-gathered just in time — see EngineOptions::comm). Per
// shard the engine
// keeps the components of Component: `param` (working dtype, what the device computes with;
// it aliases `master` when the working dtype is fp32, or with a bf16 master), `master` (fp32,
// or bf16 with EngineOptions::master_format), `exp_avg`,
// `exp_avg_sq` (fp32, bf16 or int8 with EngineOptions::state_format; the extents'
// layout: strata/state_layout.h) and `grad` (fp32,
// accumulated on the host across micro-batches). A planner puts
// each component's home in host memory or on NVMe (Placement() says which and why);
// cached copies live in faster tiers while they are in use.
//
// One training step (docs/design.md "One step, and who owns what"), as the model drives it:
//
//   engine->BeginStep({.lr = lr});
//   for each micro-batch:
//     for l in 0..L-1:   view = Acquire(l, Pass::kForward)   // params on the device
//                        ... enqueue forward kernels on Lane::kCompute ...
//                        Release(l)
//     for l in L-1..0:   view = Acquire(l, Pass::kBackward)
//                        grads = GradBuffer(l)                // fp32, device memory
//                        ... enqueue backward kernels writing `grads` ...
//                        SubmitGrads(l)                       // D2H + accumulate (host)
//                        Release(l)
//   stats = EndStep();  // waits for the optimizer and the NVMe writes, then commits
//
// Acquire returns as soon as the copy that brings the block to the device is enqueued:
// work the model enqueues on Lane::kCompute afterwards is ordered after that copy by a
// device event, so the host thread blocks only when the data is not yet in host memory
// (the prefetch is late) or device memory is full of blocks still in use. SubmitGrads
// never waits for host memory (the copy out is enqueued in the background).
//
// The access schedule is the order above (or EngineOptions::schedule); every Acquire is
// checked against it (an
// InvalidArgument names the access expected), so the order the first step ran is the order
// every step runs, and each step is planned ahead along it: per tier, a simulation with
// Belady's rule (evict what is needed farthest ahead) fixes every eviction, load and copy
// of the step within the budgets, and the engine's threads run that plan as far ahead as
// its dependencies allow (NVMe->pinned, pinned->device). A block is acquired at most once
// per pass per micro-batch, one block at a time, and SubmitGrads (or SubmitGradsFrom) is
// called exactly once per block per micro-batch, before the backward Release.
//
// Numerics: the result does not depend on the budgets, the tiers or the timing — an
// offloaded run is bit-identical to the same run with unlimited budgets (same kernels,
// same order; the gradient norm is combined in block order). With several ranks the
// gradient is the average over ranks (the communicator's reduce-scatter, a fixed order for a fixed
// world and topology) and the norm is each rank's block-order sum combined in rank order, so a run
// is bit-identical to a rerun with the same world size and equals the single-rank run up to that
// rounding.
//
// Failures: a background failure (an NVMe read or write, a device copy, the optimizer) is
// stored and returned by the next Acquire, SubmitGrads or EndStep, and by Error(); after
// one, the engine refuses further steps. Nothing committed is lost: NVMe state changes
// only by atomic commits at EndStep, and Create with `resume` reopens the last one.
//
// Thread safety: the step API (BeginStep .. EndStep, Read/WriteParams) is called by one
// thread, the model's. Placement(), Layout(), Error() may be called from any thread.
// Ownership: the engine does not own the Device (it must outlive the engine); it owns its
// pinned pool, its NVMe files (SwapStore) and its worker threads, which the destructor
// stops after finishing in-flight work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/comm.h"
#include "strata/device.h"
#include "strata/io.h"
#include "strata/optim.h"
#include "strata/status.h"

namespace strata {

// ---------------------------------------------------------------------------------------
// Model description and layout
// ---------------------------------------------------------------------------------------

struct TensorSpec {
  std::string name;            // unique within its block ("attn.c_attn.weight")
  std::vector<int64_t> shape;  // every dimension >= 1; a scalar is {1}
  bool weight_decay = true;    // false: AdamW's decoupled decay is not applied (norms, biases)
  // The optimizer group that updates it: its index in StepArgs::groups (torch's param_groups).
  // Ignored while StepArgs::groups is empty.
  int group = 0;
};

struct BlockSpec {
  std::string name;  // unique within the model ("h.3")
  std::vector<TensorSpec> tensors;
};

// Where one tensor lives inside its block's flat buffer (elements, not bytes).
struct TensorLayout {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // first element in the flat buffer; a multiple of tensor_alignment
  uint64_t numel = 0;
  bool weight_decay = true;
  int group = 0;
};

struct BlockLayout {
  std::string name;
  std::vector<TensorLayout> tensors;
  uint64_t numel = 0;         // tensor elements, without padding
  uint64_t padded_numel = 0;  // flat buffer length: aligned tensors, padded to world_size
  uint64_t shard_numel = 0;   // padded_numel / world_size
};

// ---------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------

enum class Pass : uint8_t { kForward, kBackward };
enum class Component : uint8_t { kParam, kMaster, kExpAvg, kExpAvgSq, kGrad };
inline constexpr int kNumComponents = 5;
// "param", "master", "exp_avg", "exp_avg_sq", "grad".
const char* ComponentName(Component component);

enum class Tier : uint8_t { kDevice, kHost, kNvme };
const char* TierName(Tier tier);  // "device", "host", "nvme"

// The dtype the device computes with. kAuto: fp32 on a HostDevice, bf16 on CUDA.
enum class WorkingDtype : uint8_t { kAuto, kFp32, kBf16 };
const char* WorkingDtypeName(WorkingDtype dtype);  // "auto", "fp32", "bf16"

enum class OptimizerKind : uint8_t { kAdamW, kAdam };

// Where a multi-rank run's parameter all-gathers and gradient reduce-scatters happen.
//   kDevice: each rank copies only its shard of a block to its slot of the block's device
//     buffer, and the ranks all-gather the block there, in place, on Lane::kComm (ordered
//     after those H2D copies by an event; compute waits for the gather by an event). The
//     gradient is reduce-scattered (averaged) in place in the device gradient buffer, and
//     only this rank's shard is copied back. H2D and D2H carry 1/N of each block and no
//     host staging is needed. The communicator must reach device memory: NCCL on a CUDA
//     device, or a host-memory communicator (Gloo) on a HostDevice, whose "device memory"
//     is host memory.
//   kHost: the shards are all-gathered into two pinned host buffers and the whole block is
//     copied to the device; the whole gradient is copied back and reduce-scattered on the
//     host. For a host-memory communicator with a CUDA device (Gloo without NCCL).
//   kAuto: kDevice whenever the communicator can reach the device's memory, else kHost.
// Both give bit-identical results (the same collectives on the same bytes).
enum class CollectiveMemory : uint8_t { kAuto, kDevice, kHost };
const char* CollectiveMemoryName(CollectiveMemory m);  // "auto", "device", "host"

// One access of a micro-batch's schedule (see EngineOptions::schedule).
struct ScheduleEntry {
  int block = 0;
  Pass pass = Pass::kForward;
};

// How a step's accesses run over its micro-batches.
//   kBatchMajor: each micro-batch runs the whole schedule in turn (forward and backward of
//     every block), as in the header comment.
//   kLayerMajor: each access of the schedule runs for every micro-batch in turn (block 0's
//     forward for micro-batches 0..M-1, then block 1's, ...; backward likewise), so a block's
//     parameters stay on the device across its micro-batches and cross once per pass. The
//     model keeps the activations of every micro-batch in flight. Gradients still land and
//     accumulate per micro-batch, in micro-batch order: the result is bit-identical.
enum class MicroBatchOrder : uint8_t { kBatchMajor, kLayerMajor };
const char* MicroBatchOrderName(MicroBatchOrder order);  // "batch", "layer"

// With clipping, when a block's AdamW step may run (EngineOptions::speculation).
//   kAuto: speculatively (as soon as its gradient is final, assuming the step will not
//     clip) unless the last step clipped or was skipped; then it waits for the norm, which
//     costs the serial tail but no redo while clipping keeps applying. With pipelined
//     updates (EngineOptions::pipeline_updates, where the placement allows) never: the
//     updates that wait for the norm then run under the next forward, with no redo.
//   kOn: speculatively every step. kOff: after the global norm, every step.
// A speculative update that the norm invalidates (clipping applies, or a gradient is not
// finite) is redone at EndStep from the block's previous versions — the committed NVMe
// extents, which the store keeps until the commit — with the right scale, or undone for a
// skipped step: the result is bit-identical to waiting. Only blocks whose every state has a
// committed NVMe version (home NVMe, or durable) speculate; the others wait for the norm.
enum class Speculation : uint8_t { kAuto, kOn, kOff };
const char* SpeculationName(Speculation s);  // "auto", "on", "off"
// Whether gradients go to NVMe (EngineOptions::grad_spill). With clipping a gradient is
// needed until the norm is known (a deferred update, or a redo of a speculative one).
//   kAuto: held in host memory when the host budget holds them all beside the cache the
//     states need, else written to NVMe at their final landing (kOn).
//   kOn: written to NVMe (checksummed extents like the states) at their final landing, so
//     the host may drop them and reload them when needed: the host minimum no longer grows
//     with the number of gradients pending. kOff: always held in host memory.
// Needs NVMe paths and clipping; otherwise gradients stay in host memory.
enum class GradSpill : uint8_t { kAuto, kOn, kOff };
const char* GradSpillName(GradSpill s);  // "auto", "on", "off"

// The gradient's format on its way from the device to the host. kBf16 halves the D2H bytes
// of the gradient path: before SubmitGrads the model leaves the block's gradient as
// padded_numel bf16 values (rounded to nearest even) packed at the start of the GradBuffer;
// the engine copies those bytes and widens them to fp32 on the host, where accumulation over
// micro-batches, the norm and the optimizer stay fp32. With ranks the collectives run in host
// memory (collective_memory auto resolves to kHost; kDevice, or a communicator that needs
// device buffers such as NCCL, is InvalidArgument at Create): each rank's block lands as bf16,
// is widened in place, and the reduce-scatter averages the ranks' bf16-rounded gradients in
// fp32. GradBuffer gradients only (SubmitGradsFrom copies fp32 as given).
enum class GradDtype : uint8_t { kFp32, kBf16 };
const char* GradDtypeName(GradDtype d);  // "fp32", "bf16"

struct EngineOptions {
  // The device the model computes on. Not owned; must outlive the engine. Required.
  Device* device = nullptr;

  // Device memory the engine may use for parameter copies and gradient buffers (the model's
  // activations are its own business). 0 = no engine-side cap (the Device's own budget
  // still applies). Must hold at least the largest block's params plus its gradients.
  uint64_t device_mem_bytes = 0;
  // Pinned host memory for everything the engine keeps on the host: components whose home
  // is the host, staging for NVMe transfers, gradient accumulators. 0 = unlimited
  // (everything lives in host memory; NVMe holds only the commits of a durable run).
  uint64_t host_mem_bytes = 0;
  // Folders for the NVMe tier (one striped file per folder). Empty with a finite
  // host_mem_bytes: everything must fit the host budget, else Create fails.
  std::vector<std::string> nvme_paths;
  // Stripe size across nvme_paths (bytes, multiple of 4 KiB).
  uint64_t nvme_stripe_bytes = 1 << 20;
  IoBackendOptions io;  // backend for the NVMe tier (kind auto: io_uring, else posix)
  // Makes the NVMe tier's backend from `io` (called once, when Create opens the tier); empty:
  // CreateIoBackend. E.g. FaultInjectionFactory (strata/fault_injection.h) to test a
  // program against failing or misbehaving drives.
  IoBackendFactory io_backend_factory;

  // Optimizer hyper-parameters (the learning rate is given per step in StepArgs).
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to tensors with weight_decay = true
  // Clip the global gradient L2 norm to this value (0 = off). With clipping on, a block's
  // update runs speculatively or waits for the global norm (see Speculation), while the NVMe
  // reads of its master weights and moments run ahead during backward.
  double grad_clip = 0.0;
  Speculation speculation = Speculation::kAuto;
  GradSpill grad_spill = GradSpill::kAuto;
  // With clipping, the updates that wait for the global norm run under the next step's
  // forward instead of at the end of this one (docs/design.md "Pipelined step boundary"):
  // EndStep returns once the norm is known, the next step updates the blocks in the order
  // its forward needs them (Acquire of block b waits only for b's update and its copy), and
  // the step commits once those updates are written, during the next forward. Results are
  // bit-identical either way. Reads and writes between steps (ReadParams, ReadComponent,
  // WriteParams, CommitParams), Flush and the destructor run the pending updates first and
  // commit. With ranks the commit is a collective: each rank's updates still run under the
  // next forward, and every rank commits the step at the end of the next one (not with
  // speculation kOn). Where the host cache cannot hold two steps' plans back to back, the
  // updates wait at the end of the step and Placement() says why and which budget would do.
  bool pipeline_updates = true;
  // The Adam moments' format in host memory and on NVMe (the master weights stay fp32):
  // kBf16 keeps 8 bytes of state per parameter instead of 12 (see StateFormat and
  // StateRounding in strata/optim.h); its stochastic rounding draws from a hash of the step,
  // block, rank and element, so results stay independent of budgets and tiers. kInt8 keeps
  // about 6 (8-bit codes, an fp32 scale per block of 2048 values beside them in the same
  // extent, strata/state_layout.h); it always rounds to nearest (state_rounding is ignored:
  // docs/design.md "Int8 moments" says why). A resumed engine must use the format its states
  // were written in (else Corruption at Create).
  StateFormat state_format = StateFormat::kFp32;
  StateRounding state_rounding = StateRounding::kStochastic;
  // With resume: Adam moments committed in another StateFormat (told by their extents'
  // lengths, strata/state_layout.h) are converted when the engine opens (decoded to fp32,
  // encoded in state_format: bf16 and int8 round to nearest) and written as pending
  // versions, committed with the next commit, instead of refused. fp32 -> bf16/int8 loses
  // what the coarser format cannot hold; bf16/int8 -> fp32 is exact.
  bool convert_state_format = false;
  // The master weights' format in host memory and on NVMe (docs/design.md "Compact optimizer
  // states"). kBf16Stochastic stores them as bf16 (2 bytes per parameter instead of 4), each
  // step's new weight rounded stochastically with bits hashed from the step, block, rank and
  // element (the moments' key: AdamSlice::rounding_key), so a resumed run equals an
  // uninterrupted one bit for bit. The bf16 master IS the device's params (no separate param
  // copy), so it needs the bf16 working dtype: kAuto resolves to kBf16 with it, and kFp32 is
  // InvalidArgument at Create. kBf16Kahan is NotSupported (its compensation would be a second
  // 2-byte extent per block, 4 bytes like fp32's master: nothing saved on NVMe). A resumed
  // engine must use the format its master was written in (else InvalidArgument naming both).
  MasterFormat master_format = MasterFormat::kFp32;
  // See GradDtype. Every rank must pass the same.
  GradDtype grad_dtype = GradDtype::kFp32;

  // OpenMP threads of the CPU optimizer kernels; 0 = the kernels' default (one per core).
  // Never changes a result bit.
  int optimizer_threads = 0;

  int micro_batches = 1;  // gradients accumulate (fp32, host) over this many per step
  // Activations the model stashes in the engine within a step (docs/design.md "Activations"):
  // at most `activation_count` live at once, each at most `activation_bytes`. 0 = none.
  // They live in pinned host slots (the host budget the states leave, at least a minimum the
  // planner reports) and, beyond those, in a scratch file per NVMe folder; never committed.
  uint64_t activation_bytes = 0;
  int activation_count = 0;
  // The order in which the model acquires blocks in one micro-batch. Empty = the standard
  // order (forward 0..L-1, then backward L-1..0). Otherwise every block must appear exactly
  // once per pass, its forward before its backward; Create refuses anything else
  // (InvalidArgument naming the entry). Every step runs this order (Acquire checks it).
  std::vector<ScheduleEntry> schedule;
  MicroBatchOrder micro_batch_order = MicroBatchOrder::kBatchMajor;
  WorkingDtype dtype = WorkingDtype::kAuto;
  uint32_t tensor_alignment = 64;  // elements; every tensor starts at a multiple of this
  // Multi-rank runs (ZeRO-3): the communicator that joins the ranks. Not owned; must
  // outlive the engine. nullptr = a single rank. When set, world_size and rank are taken
  // from it (a different world_size here is refused), each rank keeps only its shard of
  // every component, and the engine issues its collectives (all-gathers of parameter
  // shards, reduce-scatters of gradients, the gradient norm) from its own thread: while a
  // step is open, nobody else may issue collectives on it. Every rank must run the same
  // model with the same options (budgets included: they fix the order of collectives).
  // A communicator with world_size 1 runs the same (trivial) collectives, so one GPU
  // exercises the NCCL path. At Create the ranks compare the options that must agree
  // (layout, budgets, micro-batches, schedule, dtype, optimizer settings, ...) and every
  // rank fails with InvalidArgument naming the first that differs and its values.
  Communicator* comm = nullptr;
  // A host-memory communicator over the same ranks, for the engine's host-side collectives
  // (the gradient norm, ReadParams, the start-up options check). nullptr = `comm`, which
  // then must be a host-memory one; required when `comm` needs device buffers (NCCL).
  // Not owned; must outlive the engine.
  Communicator* host_comm = nullptr;
  CollectiveMemory collective_memory = CollectiveMemory::kAuto;
  int world_size = 1;  // shards per block; from `comm` when set
  int rank = 0;        // this rank's shard; from `comm` when set

  // Commit a complete state at every step: components whose home is the host are written
  // to NVMe after their update as well (costs NVMe writes; saves none of the reads), so
  // `resume` can restart from any commit. `resume` implies it.
  bool durable = false;
  // Reopen the NVMe state at its last commit instead of starting fresh. Requires
  // nvme_paths: the committed state (master weights and moments of every block) is kept
  // on NVMe, including components whose home is the host.
  bool resume = false;
  // The run's identity, written into the NVMe store's manifest when it is created; with
  // `resume` the store must carry the same, else Create fails with InvalidArgument (a
  // store copied from another run or rank). Opaque, at most 256 bytes (the CLI gives a
  // random run id and the rank). Empty: any store is resumed.
  std::string run_id;
  // With `resume`: the identity this rank's store recorded under the run's previous rank
  // count ("<run> rank 1 of 2" for "<run> rank 1 of 3"), accepted too; its next commit
  // records run_id (SwapStoreOptions::previous_run_id).
  std::string previous_run_id;
  // With `resume`: the store was written by another number of ranks. Each rank reads its
  // new shards of every block's states from the byte ranges of the old ranks' stores
  // (read-only, checksums verified) and writes them into its own store (this rank's
  // nvme_paths: the old rank's store with previous_run_id when rank < world_size, else a
  // new one), and the ranks commit the new layout as the resumed step, two-phase, before Create
  // returns: a crash before a rank finished that commit leaves the old stores as they were.
  // world_size 0: no re-sharding.
  struct ReshardSource {
    int world_size = 0;                                // the ranks that wrote the store
    std::vector<std::vector<std::string>> nvme_paths;  // each old rank's folders, in order
    std::vector<std::string> run_ids;                  // each old rank's store identity
  };
  ReshardSource reshard_from;
  // Write a Chrome/Perfetto trace (JSON) of every operation to this file; "" = none.
  std::string trace_path;
  // The trace's process: its name and pid (one per rank, so that the ranks' traces opened
  // together stay apart); "" = "strata engine".
  std::string trace_process_name;
  int trace_pid = 1;
  // Trace only steps [trace_first_step, trace_last_step] (1-based, inclusive, counting
  // resumed steps; 0 = unbounded); the operations between two traced steps count as the
  // earlier one's.
  int64_t trace_first_step = 0, trace_last_step = 0;
  // Expected bandwidths (bytes/s) used only to predict the step's bound in Placement();
  // 0 = use built-in guesses (kDefault*Bps). They never change a decision that affects
  // numerics.
  double nvme_read_bps = 0, nvme_write_bps = 0, h2d_bps = 0, d2h_bps = 0, cpu_optim_bps = 0;
  static constexpr double kDefaultNvmeReadBps = 2e9, kDefaultNvmeWriteBps = 1.5e9,
                          kDefaultH2dBps = 10e9, kDefaultD2hBps = 10e9;
  // The expected bandwidths with the guesses filled in.
  double ExpectedNvmeReadBps() const { return Expected(nvme_read_bps, kDefaultNvmeReadBps); }
  double ExpectedNvmeWriteBps() const { return Expected(nvme_write_bps, kDefaultNvmeWriteBps); }
  double ExpectedH2dBps() const { return Expected(h2d_bps, kDefaultH2dBps); }
  double ExpectedD2hBps() const { return Expected(d2h_bps, kDefaultD2hBps); }
  static double Expected(double given, double guess) { return given > 0 ? given : guess; }
};

// ---------------------------------------------------------------------------------------
// Placement: what the planner chose
// ---------------------------------------------------------------------------------------

struct ComponentPlacement {
  int block = 0;
  Component component = Component::kMaster;
  Tier home = Tier::kHost;
  uint64_t bytes = 0;  // of this rank's shard
};

// Bytes per step over each edge of the tier graph.
struct EdgeBytes {
  uint64_t nvme_read = 0;
  uint64_t nvme_write = 0;
  uint64_t h2d = 0;
  uint64_t d2h = 0;
  uint64_t comm = 0;  // collectives' bus bytes (CommOpRecord::bytes); 0 with one rank
};

struct PlacementReport {
  std::vector<ComponentPlacement> components;  // every block x component of this rank
  uint64_t device_budget_bytes = 0;            // 0 = none
  uint64_t device_min_bytes = 0;               // below: refused; at or above: works
  uint64_t host_budget_bytes = 0;              // 0 = unlimited
  uint64_t host_min_bytes = 0;                 // below: refused; at or above: works
  uint64_t host_resident_bytes = 0;            // components whose home is the host
  uint64_t host_cache_bytes = 0;               // the rest: staging and cache for NVMe homes
  uint64_t nvme_bytes = 0;                     // components whose home is NVMe (4 KiB pages)
  // What this rank's swap files take on disk: two versions of every NVMe extent (the
  // committed one stays until the next commit), room for fragmentation, whole stripes per
  // folder. 0 without NVMe.
  uint64_t nvme_file_bytes = 0;
  uint64_t nvme_stripe_bytes = 0;  // with NVMe: the swap files' stripe
  int nvme_folders = 0;            // with NVMe: one swap file each
  // The activation stash (EngineOptions::activation_bytes/count): slots of activation_bytes
  // rounded to 4 KiB; how many live in pinned host memory (counted in the host budget and in
  // host_min_bytes, whose stash part is min(activation_count, 3) slots: a landing, a fetch
  // staging and a prefetch) and what the scratch files hold for the rest (0: every activation
  // fits the host slots). All 0 without activations.
  uint64_t activation_slot_bytes = 0;
  int activation_count = 0;
  int activation_host_slots = 0;
  uint64_t activation_host_bytes = 0;
  uint64_t activation_nvme_bytes = 0;
  // The most activations of activation_slot_bytes the budgets admit, the states placed as
  // here: in pinned host memory beside the states (-1: no host budget, so none bounds them),
  // and in scratch files in the NVMe folders (their free space at Create plus what this
  // engine's scratch files there take; 0 without NVMe). Create admits an activation_count up
  // to the larger of the two and refuses one above it (tests/engine/activation_stash_test.cc).
  int64_t activation_host_capacity = 0;
  int64_t activation_nvme_capacity = 0;
  WorkingDtype dtype = WorkingDtype::kFp32;       // resolved
  StateFormat state_format = StateFormat::kFp32;  // of the moments
  MasterFormat master_format = MasterFormat::kFp32;
  // Resolved (kDevice or kHost) with a communicator; kAuto without one (no collectives).
  CollectiveMemory collective_memory = CollectiveMemory::kAuto;
  EdgeBytes predicted_bytes;           // per step, upper estimate
  double predicted_bound_seconds = 0;  // from the bandwidths in EngineOptions
  std::string predicted_bound_resource;
  std::vector<std::string> reasons;  // one line per decision, for people
  std::string ToString() const;      // multi-line summary for printing
};

// ---------------------------------------------------------------------------------------
// Steps
// ---------------------------------------------------------------------------------------

// One optimizer group's AdamW settings for a step (one of torch's param_groups): the tensors
// whose TensorSpec::group is its index in StepArgs::groups are updated with these.
struct OptimizerGroup {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // tensors with TensorSpec::weight_decay = false get none
};

struct StepArgs {
  double lr = 1e-3;
  // Multiplies every gradient before clipping and the update (e.g. 1/loss_scale, or
  // 1/micro_batches for a mean over micro-batches). The norm reported is of scaled grads.
  double grad_scale = 1.0;
  // Per-group settings (any number may differ, and they may change from step to step, as a
  // scheduler changes them). Empty: every tensor is updated with `lr` and EngineOptions' beta1,
  // beta2, eps and weight_decay. Otherwise every tensor's TensorSpec::group must index it
  // (BeginStep refuses the step with InvalidArgument naming the tensor otherwise), and `lr`
  // is not used. A step whose updates are deferred (EngineOptions::pipeline_updates) runs them
  // with its own groups.
  std::vector<OptimizerGroup> groups = {};
  // Added to the step count of AdamW's bias correction (1 - beta^t with t = ResumedStep() +
  // the steps this engine ran + step_offset, at least 1), which also keys the bf16 moments'
  // stochastic rounding: for moments written with WriteComponent from a run whose step count
  // differs from this engine's (torch's optimizer.load_state_dict). The store's commits count
  // steps the same way (ResumedStep() + steps run + step_offset), so a resumed engine continues
  // the count with no offset to restore; an offset that would make the committed step go back
  // fails the commit (the store's steps only increase): load older moments into a fresh store.
  int64_t step_offset = 0;
};

// A block's parameters on the device, valid from Acquire until Release.
struct BlockView {
  int block = 0;
  void* params = nullptr;  // device pointer to the flat buffer (working dtype)
  WorkingDtype dtype = WorkingDtype::kFp32;
  const BlockLayout* layout = nullptr;  // tensor offsets (elements) into `params`
};

// The resources whose busy time bounds a step.
// kComm: the communicator's collectives (time with one in flight), multi-rank runs only.
enum class Resource : uint8_t { kNvmeRead, kNvmeWrite, kH2D, kD2H, kCpuOptim, kCompute, kComm };
inline constexpr int kNumResources = 7;
const char* ResourceName(Resource r);  // "nvme_read", ..., "cpu_optim", "compute", "comm"

struct StepStats {
  int64_t step = 0;  // the step just committed (1-based)
  double seconds =
      0;  // BeginStep to the end of EndStep
          // The lower bound: the busiest resource's busy time (time with at least one of its
  // operations in flight), and which resource that was (a Resource name, or "nvme" for
  // the drives' combined read+write busy time).
  double bound_seconds = 0;
  std::string bound_resource;
  double efficiency =
      0;  // bound_seconds / seconds
          // Compute lane idle from BeginStep to the end of its last operation of the step: the
  // time the device waited for data (the "stall" lane of the trace).
  double stall_seconds = 0;
  // The serial tail: from the end of the compute lane's last operation of the step (the last
  // backward) to the end of EndStep — the optimizer steps, NVMe writes and the commit that
  // did not overlap backward. seconds ~= compute busy + stall_seconds + tail_seconds.
  double tail_seconds = 0;
  // Blocks whose optimizer step ran twice this step: updated before the global gradient norm
  // was known and redone from their previous versions once it showed that clipping or a
  // non-finite gradient applies. 0 while the optimizer waits for the norm before updating.
  int64_t redone_blocks = 0;
  // The time EndStep spent redoing (or undoing) them, part of tail_seconds.
  double redo_seconds = 0;
  // Blocks whose updates wait for the norm and run under the next step's forward
  // (EngineOptions::pipeline_updates): this step commits during the next one (or at Flush).
  // Its final statistics (Engine::TakeCommittedStats) move that work to it: the deferred
  // updates' cpu_optim busy time, their nvme_write bytes (exactly what the updates at the end
  // of the step write) and busy time (their writes and the commit, up to that commit), and
  // out of the next step's; where they ran between steps (Flush, a read), their time is added
  // to seconds and tail_seconds. nvme_read, the other edges and nvme_busy_seconds stay the
  // window's (what a load serves is the plan's choice).
  int64_t deferred_blocks = 0;
  // EndStep's figures: the previous step's deferred updates and its commit ran under this
  // step for this long (BeginStep to that commit); 0 when nothing was carried. Final
  // figures: this step's own deferred updates and commit ran under the next step this long.
  double overlapped_seconds = 0;
  // This step's updates ran speculatively (before the norm; see Speculation).
  bool speculative = false;
  double busy_seconds[kNumResources] = {};
  // The NVMe drives' busy time: reads and writes share the drives, so the union of their
  // busy intervals is a resource of its own (bound_resource "nvme" when it is the busiest).
  double nvme_busy_seconds = 0;
  EdgeBytes bytes;
  // Of `bytes`, the activation stash's own: d2h of StashActivation, h2d of FetchActivation,
  // nvme_write/nvme_read of activations spilled to and read back from the scratch files.
  EdgeBytes activation_bytes;
  // FetchActivation calls that had to wait for an NVMe read (no prefetch, or a late one).
  int64_t activation_fetch_waits = 0;
  double grad_norm = 0;  // global L2 norm of the (scaled) gradient, before clipping
  double clip_coef = 1;  // factor applied to the gradient (1 without clipping)
  // A non-finite gradient (or a norm that overflows), on any rank: no block was updated
  // this step and the commit keeps the last good states. With clipping every update waits
  // for the global norm, so such a step is always skipped whole. Without clipping an update
  // starts once every gradient landed so far is finite (a non-finite loss makes the first
  // gradient non-finite, so that step is skipped whole too); a non-finite gradient found
  // after some updates ran makes EndStep fail with kAborted and commit nothing.
  bool skipped = false;
  uint64_t peak_device_bytes = 0;  // engine's device memory, peak during the step
  uint64_t peak_host_bytes = 0;    // pinned pool, peak during the step
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Lays out the blocks, runs the planner, allocates the pinned pool and opens the NVMe
  // store. Fails with InvalidArgument for bad specs/options (naming the value), and with
  // OutOfMemory when the budgets cannot work, naming the numbers and the minimum that would
  // ("device budget 1.0 MiB is smaller than block 'h.3' needs (params 4.0 MiB + grads
  // 4.0 MiB); need at least 8.0 MiB"). With options.resume the NVMe store is reopened at its
  // last commit (NotFound when there is none) and ResumedStep() says which.
  static Result<std::unique_ptr<Engine>> Create(std::vector<BlockSpec> blocks,
                                                const EngineOptions& options);

  virtual const std::vector<BlockLayout>& Layout() const = 0;
  virtual const PlacementReport& Placement() const = 0;
  // The last committed step: 0 for a fresh engine (after initial params), or the step a
  // resumed engine continues from. The next BeginStep runs step ResumedStep()+1.
  virtual int64_t ResumedStep() const = 0;

  // Initial values (before the first step) or replacements between steps: sets one tensor
  // of a block's master weights (and param copy; a bf16 master takes the nearest bf16); with
  // several ranks, each keeps its shard's part of `values` (every rank passes the whole tensor).
  // Elements beyond the tensor, padding, are zero. Moments start at zero. InvalidArgument when the
  // size does not match the tensor. The new values are committed by the next BeginStep (or
  // CommitParams).
  virtual Status WriteParams(int block, int tensor, std::span<const float> values) = 0;
  // Commits values set by WriteParams as the state of step ResumedStep() now (optional;
  // BeginStep does it too).
  virtual Status CommitParams() = 0;
  // Reads one tensor of the master weights as fp32 (between steps). With world_size > 1 it is
  // a collective (an all-gather of the block's shards): every rank calls it, in the same
  // order; Comm/Timeout when a rank is lost.
  virtual Status ReadParams(int block, int tensor, std::span<float> out) const = 0;
  // Reads a whole component of a block's shard (shard_numel fp32 values; kParam and
  // kMaster both give the master weights, a bf16 master widened exactly; bf16 moments are
  // widened exactly, int8 ones dequantized). For tests and
  // checkpoints; between steps. InvalidArgument for kGrad (gradients are freed after each update)
  // or a wrong size.
  virtual Status ReadComponent(int block, Component component, std::span<float> out) const = 0;
  // Writes a whole component of a block's shard, the mirror of ReadComponent (between steps;
  // the deferred updates of the last step run first): shard_numel fp32 values. kMaster sets
  // the master weights and the working-dtype param copy, as WriteParams for the whole shard
  // (padding included; a bf16 master rounds each value to nearest, ties to even). kExpAvg,
  // kExpAvgSq set the moments; with StateFormat::kBf16 each value is rounded to the nearest bf16,
  // ties to even, whatever EngineOptions::state_rounding says (stochastic rounding is keyed by a
  // step's update): a value ReadComponent gave (a bf16 widened) is stored exactly. kInt8 quantizes
  // each run's blocks (strata/state_layout.h) to nearest; a value ReadComponent gave is stored
  // again with the same codes and scales unless the block's absmax moved. Committed as WriteParams
  // is, by the next BeginStep or CommitParams. InvalidArgument for kParam or kGrad, a wrong size,
  // or during a step. One rank writes its own shard (with several, each rank writes its own).
  virtual Status WriteComponent(int block, Component component, std::span<const float> values) = 0;

  // Starts a step. InvalidArgument when a step is already open or args are out of range;
  // the stored background error when there is one.
  virtual Status BeginStep(const StepArgs& args) = 0;
  // The block's working params on the device (see the header comment for the waiting rule).
  virtual Result<BlockView> Acquire(int block, Pass pass) = 0;
  // The model has enqueued all its work that uses the block's params.
  virtual Status Release(int block) = 0;
  // Device buffer of padded_numel fp32 values the model writes the block's gradient into
  // (tensor offsets as in the layout). Valid from the backward Acquire until SubmitGrads. Every
  // element of every tensor must be written; padding is ignored.
  virtual Result<float*> GradBuffer(int block) = 0;
  // The model has enqueued (on Lane::kCompute) the work that writes the gradient buffer.
  // The engine copies it to the host and accumulates it; after the last micro-batch the
  // block's optimizer step starts as soon as the copy lands.
  virtual Status SubmitGrads(int block) = 0;
  // SubmitGrads with the gradient read from the caller's memory instead of the GradBuffer, for
  // frameworks that allocate their own gradient tensors (the Python layer): it saves copying
  // them into the buffer. grads[i] holds tensor i's numel fp32 values (nullptr: zeros) in
  // memory the device can copy from: torch's CUDA tensors on a CudaDevice, host memory on the
  // HostDevice. Written by work already enqueued on Lane::kCompute or done. The memory must
  // stay valid and unchanged until GradsRead() reaches the returned ticket (tickets count 1,
  // 2, ... over the engine's life; EndStep waits for all). One rank only: with a
  // communicator the reduce-scatter reads the gradient buffer (NotSupported; use SubmitGrads).
  virtual Result<uint64_t> SubmitGradsFrom(int block, std::span<const float* const> grads) = 0;
  // The last ticket of SubmitGradsFrom whose memory the engine has finished reading.
  virtual uint64_t GradsRead() const = 0;
  // Waits for every optimizer step and NVMe write of the step, commits the new state
  // (atomic manifest switch), and returns the step's statistics. A step partly updated
  // before a non-finite gradient was found is not committed (kAborted; see
  // StepStats::skipped). With EngineOptions::pipeline_updates, the updates that wait for the
  // norm are left to the next step (StepStats::deferred_blocks), which commits this one.
  // Activations still live are dropped (after their I/O in flight has finished).
  virtual Result<StepStats> EndStep() = 0;
  // The step's global gradient L2 norm before clipping (with several ranks, combined), once
  // every gradient is final: waits as EndStep does for the step's work, so the value is
  // exactly the StepStats::grad_norm that EndStep then returns (EndStep does not wait again).
  // For a caller that must know the norm before the step ends (torch's clip_grad_norm_ on an
  // offloaded model). REQUIRES: every access of the step released, and grad_clip > 0 (without
  // clipping updates run before the norm is known); InvalidArgument otherwise.
  virtual Result<double> GradNorm() = 0;
  // Activations (docs/design.md "Activations"), within a step, on the model's thread. Keys
  // are any uint32 the model chooses; EndStep drops the activations still live.
  //
  // Copies `bytes` (<= activation_bytes) from device memory at device_src (written by work
  // already enqueued on Lane::kCompute) into activation `key`. Returns once the copy is
  // enqueued, with the event of its completion: the caller may overwrite device_src only with
  // work ordered after that event (Device::WaitEvent(Lane::kCompute, ev)). Blocks only while
  // every host slot is taken (until a spill to NVMe frees one). InvalidArgument: no step
  // open, key live already, bytes 0 or too large. OutOfMemory naming activation_count when
  // more would be live. The stored background error when there is one.
  virtual Result<EventPtr> StashActivation(uint32_t key, const void* device_src,
                                           uint64_t bytes) = 0;
  // Enqueues the copy of activation `key` into device_dst (its stashed bytes), ordered after
  // the work already enqueued on Lane::kCompute (which may still use device_dst); work
  // enqueued on Lane::kCompute after this call runs after the copy. Blocks the caller only
  // while the activation is not in host memory yet (NVMe read late). `last`: the key is
  // dropped once the copy is done (its slot is free). Corruption naming key/file/offset on a
  // checksum mismatch; the I/O error (naming the file) on EIO; either is stored like any
  // background error (the step cannot commit). InvalidArgument for an unknown key or no step.
  virtual Status FetchActivation(uint32_t key, void* device_dst, bool last) = 0;

  // Runs the last step's deferred updates now and commits it (between steps; OK when
  // nothing is pending). For a program that ends, or stops on a signal, after EndStep.
  virtual Status Flush() = 0;
  // Sets EngineOptions::optimizer_threads from the next update on (between steps; never
  // changes a result bit). InvalidArgument during a step or for a negative count.
  virtual Status SetOptimizerThreads(int threads) = 0;
  // The final statistics of the steps committed since the last call, in step order. A
  // step's statistics are final when its commit lands: at EndStep for a step that defers
  // nothing (they are EndStep's figures then), else once its deferred updates have run
  // (StepStats::deferred_blocks): after the next EndStep, whose call then returns both steps
  // where the next one defers nothing, or after Flush or a read or write between steps.
  // Unlike EndStep's figures, taken over the step's own window, final figures count the
  // step's deferred updates and not the previous step's (see StepStats). Why a queue, not
  // the last committed step: two steps can commit within one call (a skipped or speculative
  // step after one that deferred), and Flush returns no statistics of its own.
  virtual std::vector<StepStats> TakeCommittedStats() = 0;

  // The first stored background error, or OK.
  virtual Status Error() const = 0;
};

// The step of the last commit of the swap store whose first folder is `folder`, read from its
// manifest without opening or locking the store (nothing is made or changed there):
// nullopt when the store was created but never committed. NotFound when the folder holds no
// manifest; Corruption (naming the file) when it cannot be decoded.
Result<std::optional<uint64_t>> PeekCommittedStep(const std::string& folder);

// The same, with the run identity its manifest records and, when a two-phase commit of
// several ranks was cut short between its phases, the prepared manifest's step and identity
// (what a resume decides from: engine/rank_commit.h). Nothing is locked, made or changed.
struct StorePeek {
  std::optional<uint64_t> step;
  std::string run_id;
  std::optional<uint64_t> prepared_step;
  std::string prepared_run_id;
};
Result<StorePeek> PeekStore(const std::string& folder);

// The names of the files that hold a run's committed state (master weights, moments, step) in
// its NVMe folder `index` of `folders` (EngineOptions::nvme_paths in order): folder 0's
// manifest, then the folder's swap file. With the engine closed, these files of every folder
// are the whole run: a copy of them is a copy of the run (what a checkpoint holds). Nothing
// else in a folder is the run's state, and a copy must neither take nor replace it: the
// lock, a manifest's temporary, the activations' scratch files, the user's own files.
std::vector<std::string> StoreStateFiles(size_t index, size_t folders);

// The block layouts an engine of `world_size` ranks gives `blocks` with `tensor_alignment`
// (EngineOptions::tensor_alignment): each tensor's offset in its block's flat buffer, and the
// padded and per-rank shard lengths. What a run's stores hold, shard r of block b being rank
// r's "b<b>.master" extent: tools that read a store without an engine (strata export,
// verify) find the tensors with it. InvalidArgument as Engine::Create for a bad spec.
Result<std::vector<BlockLayout>> ComputeBlockLayout(const std::vector<BlockSpec>& blocks,
                                                    uint32_t tensor_alignment, int world_size);

}  // namespace strata
