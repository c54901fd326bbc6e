// The engine's planner: the block layout, the home of every component (host or NVMe), and
// the per-step plans that the executors follow.
//
// Why static plans: the access schedule of a step is known (the standard forward/backward
// order, checked on every Acquire), so the residency of every tier can be simulated ahead
// of time with Belady's rule (evict what is needed farthest in the future). The simulation
// yields, per tier, an ordered list of operations (evict X, then load Y for use U) whose
// peak footprint is computed exactly. The executors run these lists in order, each
// operation waiting only for the operations it depends on, so prefetch runs as far ahead
// as the budget lets the simulation run ahead, and the budgets hold by construction (the
// allocators check them again). The same simulation, run at Create with trial budgets,
// gives the minimum budgets an impossible configuration is refused with.
//
// Plain functions over values (no engine state, no EngineOptions: PlanOptions is the narrow
// view the planner reads); safe from any thread. plan.cc holds the layout, the schedule and
// the per-tier simulations; plan_placement.cc the homes and the minimum budgets;
// plan_comm.cc the order of the collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/bytes.h"
#include "strata/engine.h"
#include "strata/state_layout.h"
#include "strata/status.h"

namespace strata::engine_internal {

// What the planner reads of a run: the part of EngineOptions that shapes the plans, resolved
// (no kAuto dtype; collective memory resolved with a communicator).
struct PlanOptions {
  std::vector<ScheduleEntry> schedule;  // one micro-batch's access order; empty = standard
  int micro_batches = 1;
  MicroBatchOrder micro_batch_order = MicroBatchOrder::kBatchMajor;
  bool clip = false;  // gradient clipping: an update's scale depends on the global norm
  Speculation speculation = Speculation::kAuto;  // with clip (see EngineOptions)
  GradSpill grad_spill = GradSpill::kAuto;
  bool pipeline = false;                     // with clip: EngineOptions::pipeline_updates
  WorkingDtype dtype = WorkingDtype::kFp32;  // resolved: kFp32 or kBf16
  bool bf16_grads = false;  // EngineOptions::grad_dtype kBf16: the D2H copy carries half
  StateFormat state_format = StateFormat::kFp32;     // of the moments
  MasterFormat master_format = MasterFormat::kFp32;  // kBf16Stochastic: 2 bytes, no param copy
  uint64_t device_budget = 0;                        // 0 = unlimited
  uint64_t host_budget = 0;                          // 0 = unlimited
  bool nvme = false;                                 // NVMe paths were given
  int nvme_folders = 0;                              // how many (one swap file each)
  uint64_t nvme_stripe_bytes = 1 << 20;              // the swap files' stripe
  bool durable = false;  // every step commits the states to NVMe (resume too)
  int rank = 0;
  int world_size = 1;
  // kDevice or kHost with a communicator; kAuto without one (no collectives).
  CollectiveMemory collectives = CollectiveMemory::kAuto;
  // Bandwidths for the predicted transfer bound (bytes/s): EngineOptions::Expected*Bps.
  double nvme_read_bps = EngineOptions::kDefaultNvmeReadBps;
  double nvme_write_bps = EngineOptions::kDefaultNvmeWriteBps;
  double h2d_bps = EngineOptions::kDefaultH2dBps;
  double d2h_bps = EngineOptions::kDefaultD2hBps;
  // The activation stash (EngineOptions::activation_bytes/count); 0 = none.
  uint64_t activation_bytes = 0;
  int activation_count = 0;
};

// The planner's view of `options` (validated and resolved by Engine::Create) with the
// working dtype `dtype` resolved for the device.
PlanOptions PlanOptionsFrom(const EngineOptions& options, WorkingDtype dtype);

// Lays out `blocks`; InvalidArgument naming the block/tensor for empty names, duplicate
// names, non-positive dimensions or an alignment of 0.
Result<std::vector<BlockLayout>> ComputeLayout(const std::vector<BlockSpec>& blocks,
                                               uint32_t tensor_alignment, int world_size);

// One access of the schedule: the model acquires `block` for `pass` in micro-batch `micro`.
struct Access {
  int block = 0;
  Pass pass = Pass::kForward;
  int micro = 0;
  bool operator==(const Access&) const = default;
};
// Per micro-batch: forward 0..L-1, then backward L-1..0.
std::vector<Access> StandardSchedule(int blocks, int micro_batches);
// `order` (one micro-batch; the standard order when it is empty) over `micro_batches`:
// batch-major repeats it per micro-batch, layer-major repeats each of its accesses for every
// micro-batch in turn. InvalidArgument when a block is missing, repeated in a pass, out of
// range, or has its backward before its forward.
Result<std::vector<Access>> BuildSchedule(
    int blocks, const std::vector<ScheduleEntry>& order, int micro_batches,
    MicroBatchOrder micro_order = MicroBatchOrder::kBatchMajor);
std::string DescribeAccess(const Access& a);

// ---------------------------------------------------------------------------------------
// Device tier
// ---------------------------------------------------------------------------------------

// A device buffer of the plan: a block's params (reused across accesses while resident) or
// the gradient buffer of one backward access.
struct DevBuffer {
  bool grad = false;
  int block = 0;
  uint64_t bytes = 0;  // what is allocated (rounded to 256)
};

// What the device feeder does for access `a`, in order: free `frees` (each after its last
// use finished), then for a param load allocate `param_buffer` and copy it in, and for a
// backward access allocate `grad_buffer`.
struct DevStep {
  std::vector<int> frees;
  int param_buffer = -1;
  bool load = false;
  int grad_buffer = -1;
};

struct DevicePlan {
  std::vector<DevBuffer> buffers;
  std::vector<DevStep> steps;  // one per access
  std::vector<int> end_frees;  // buffers still allocated at the end of the step
  uint64_t peak_bytes = 0;     // simulated peak
};

// param_bytes/grad_bytes per block; capacity 0 = unlimited. OutOfMemory when one access
// does not fit.
Result<DevicePlan> PlanDevice(const std::vector<Access>& schedule,
                              const std::vector<uint64_t>& param_bytes,
                              const std::vector<uint64_t>& grad_bytes, uint64_t capacity);

// ---------------------------------------------------------------------------------------
// Host tier
// ---------------------------------------------------------------------------------------

// Host objects are numbered block * kNumComponents + component.
inline int ObjIndex(int block, Component c) { return block * kNumComponents + int(c); }
inline int ObjBlock(int obj) { return obj / kNumComponents; }
inline Component ObjComponent(int obj) { return Component(obj % kNumComponents); }

enum class UseKind : uint8_t {
  kH2D,     // a host copy is the source of a param load to the device (access)
  kGradIn,  // a backward access's gradient lands in the block's grad accumulator
  kOpt,     // the block's optimizer step: reads grad, updates master/moments (/param)
};

struct UseObj {
  int obj = 0;
  bool produce = false;  // allocated, not loaded: the use writes every byte
  int seq = 0;           // this is the seq-th use of obj in the step (0-based)
};

struct HostUse {
  UseKind kind = UseKind::kH2D;
  int block = 0;
  int access = -1;  // kH2D, kGradIn: the access; kOpt: the access after which it may run
  std::vector<UseObj> objs;
  // kOpt: the update of the previous step, carried into this one (HostPlanInput::carried).
  bool carried = false;
};

enum class HostOpKind : uint8_t { kEvict, kLoad, kAlloc };
struct HostOp {
  HostOpKind kind = HostOpKind::kLoad;
  int obj = 0;
  int use = -1;         // kLoad/kAlloc: the use it serves
  int uses_before = 0;  // kEvict: wait until this many uses of obj completed
  uint64_t offset = 0;  // kLoad/kAlloc: where in the cache region it goes
};

struct HostPlan {
  std::vector<HostUse> uses;
  std::vector<HostOp> ops;
  std::vector<int> opt_uses;      // indices into uses of the kOpt uses, in order
  std::vector<int> h2d_use;       // per access: its kH2D use or -1
  std::vector<int> grad_use;      // per access: its kGradIn use or -1
  std::vector<int> end_resident;  // cached objects resident after the step
  // Gradients kept resident past their update until the step's norm is known (a redo may
  // need them): the engine releases them at EndStep (HostTier::ReleaseLocked).
  std::vector<int> held;
  // Blocks whose updates wait for the norm and run under the next step (HostPlanInput::
  // pipelined), in the order the next forward needs them; their gradients stay (in
  // end_resident, or on NVMe when spilled).
  std::vector<int> deferred;
  std::vector<uint64_t> offset;  // per object: its place in the cache region (when cached)
  uint64_t peak_bytes = 0;       // simulated peak of the cache
};

struct HostPlanInput {
  const std::vector<Access>* schedule = nullptr;
  const DevicePlan* device = nullptr;
  int blocks = 0;
  int micro_batches = 1;
  bool clip = false;  // gradient clipping: an update's scale depends on the global norm
  // With clip: this step's updates of restorable blocks run speculatively, before the norm
  // is known (each assuming no clipping; EndStep redoes them when it applies). Without it,
  // or for a block that is not restorable, an update waits for the norm (after backward).
  bool speculative = false;
  std::vector<bool> restorable;  // per block: every state has a committed version on NVMe
  // Gradients are written to NVMe at their final landing and may leave host memory from then
  // on (reloaded for a deferred update or a redo). Without it a gradient stays in host memory
  // from its first landing to its update, and to the end of the step when the update was
  // speculative.
  bool spill_grads = false;
  // With clip and not speculative: the updates that wait for the norm are left out of this
  // step (HostPlan::deferred) and run under the next one, as its `carried` updates.
  bool pipelined = false;
  // Updates of the previous step run by this one (its HostPlan::deferred), each before the
  // first use of its block (the next forward's parameter copy waits for the update).
  std::vector<int> carried;
  bool separate_param = false;         // the param component exists (working dtype != fp32)
  std::vector<uint64_t> obj_bytes;     // per object, as charged by the pinned pool
  std::vector<bool> cached;            // per object: lives in the cache (NVMe home, or grad)
  std::vector<int> start_resident;     // cached objects resident at the start
  std::vector<uint64_t> start_offset;  // per object: where a resident one sits
  uint64_t capacity = 0;               // cache bytes
};

// OutOfMemory when a use cannot fit the capacity.
Result<HostPlan> PlanHost(const HostPlanInput& in);

// The host plans of consecutive steps under `in`: the first from `in` as given, each later
// one from what the one before left (and carrying its deferred updates), until a step would
// start from what an earlier one started from, so that plans[cycle..] repeat from then on
// (one plan, or a few where what a step leaves cached alternates). At most 16 plans (the last
// stands for the steady state when no cycle closes by then). Where a later plan does not
// fit, the engine starts the next step from an empty cache, so the plans so far repeat
// (cycle 0); the first plan's failure is returned.
struct SteadyPlans {
  std::vector<HostPlan> plans;
  size_t cycle = 0;
};
Result<SteadyPlans> ReplayToSteadyState(const HostPlanInput& in);

// ---------------------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------------------

struct PlacementPlan {
  std::vector<Tier> home;           // per object (grads: kHost)
  std::vector<uint64_t> obj_bytes;  // per object, pool-rounded; 0 for absent components
  // Bytes per element of each component (param: the working dtype; moments: state_format,
  // scales apart).
  uint32_t elem_bytes[kNumComponents] = {4, 4, 4, 4, 4};
  // Per block: this rank's state extents (master and moments; int8: codes, then scales).
  std::vector<BlockStateLayout> state;
  // The bytes an object's host copy and extent hold (obj_bytes before the pool's rounding).
  uint64_t DataBytes(const std::vector<BlockLayout>& layout, int obj) const;
  std::vector<bool> cached;     // per object
  uint64_t cache_capacity = 0;  // host bytes for the cache
  uint64_t staging_bytes = 0;   // fixed staging (gradient accumulation), outside the cache
  // Of staging_bytes, multi-rank buffers: 2 x gather_bytes (full-block parameter gathers)
  // plus one full-block gradient landing buffer. 0 with one rank.
  uint64_t comm_staging_bytes = 0;
  uint64_t gather_bytes = 0;
  uint64_t resident_bytes = 0;  // host-homed components
  bool use_nvme = false;
  uint64_t nvme_bytes = 0;  // bytes of NVMe-homed (or durable) components
  // The swap store's extent space (SwapCapacity of nvme_bytes); 0 without NVMe.
  uint64_t swap_capacity_bytes = 0;
  PlacementReport report;
  // What the executors follow: the step's accesses, the device plan, and per block the
  // device bytes of its params (working dtype) and of its gradient buffer (fp32).
  std::vector<Access> schedule;
  DevicePlan device;
  std::vector<uint64_t> param_bytes, grad_bytes;
  int micro_batches = 1;
  bool clip = false;
  bool speculation = false;      // clip, and some step may update speculatively
  std::vector<bool> restorable;  // per block (see HostPlanInput); empty without a store
  bool spill_grads = false;      // see HostPlanInput
  // Updates that wait for the norm run under the next step's forward (HostPlanInput::
  // pipelined): the option is on and the host cache holds two steps' plans back to back.
  bool pipeline = false;
  bool separate_param = false;

  bool Restorable(int b) const { return b < int(restorable.size()) && restorable[b]; }
};

// The swap store's extent space for `nvme_bytes` of states: a committed and a pending
// version of every extent (a superseded version's space is reused only after the commit that
// supersedes it), plus two stripes per folder, 16 MiB and two of the largest extent for
// fragmentation: first fit over extents of different sizes leaves holes, and with extents
// larger than the fixed slack the last write of a step found none big enough (12 x 768,
// 27 MiB extents, with the updates written in forward order).
uint64_t SwapCapacity(uint64_t nvme_bytes, uint64_t stripe_bytes, int folders,
                      uint64_t largest_extent);
// What the swap files of that capacity take on disk, all folders together: each file holds
// whole stripes and the files are equal (SwapStore::Open preallocates them so).
uint64_t SwapFileBytes(uint64_t capacity_bytes, uint64_t stripe_bytes, int folders);

// The host plan input of a step under `placement` starting from an empty cache (the one
// PlanPlacement validated); the caller adds what the last step left resident. Points into
// `placement`, which must outlive it.
HostPlanInput HostInputFor(const PlacementPlan& placement);

// Chooses homes and the cache size, or refuses with OutOfMemory naming the figures that
// would work. The minimums it reports (report.device_min_bytes, report.host_min_bytes) are
// thresholds with a guarantee: every budget below one is refused and every budget at or
// above it plans (device and host plans; HostInputFor's first step, and every later step
// at least from an empty cache) within the budget.
// tests/engine/plan_test.cc checks this over random models, schedules and budgets.
// The activation stash's share (plan_activations.cc): the states are planned first
// (PlanStates) with the host budget less the stash's minimum, min(activation_count,
// kMinActivationHostSlots) slots; the activations get the host budget the states leave, in
// whole slots of activation_bytes rounded to 4 KiB, and the rest of them live on NVMe
// (report.activation_*). OutOfMemory naming the budget that would fit, or --nvme.
Result<PlacementPlan> PlanPlacement(const std::vector<BlockLayout>& layout,
                                    const PlanOptions& options);
// The states alone (every activation field of `options` ignored): homes, cache, minimums.
Result<PlacementPlan> PlanStates(const std::vector<BlockLayout>& layout,
                                 const PlanOptions& options);
// The stash's host minimum when activations go to NVMe: a landing slot for the next stash,
// a staging slot for a fetch read from NVMe, and one for a prefetch.
inline constexpr int kMinActivationHostSlots = 3;

// ---------------------------------------------------------------------------------------
// Collectives (multi-rank)
// ---------------------------------------------------------------------------------------

// One collective of the step, in the order the comm thread issues them.
struct CommItem {
  enum Kind : uint8_t {
    kGather,  // all-gather of the params loaded for `access` (into gather buffer `slot`)
    kReduce,  // reduce-scatter of the gradient of backward `access`
    kNorm,    // the global gradient norm (last)
  } kind = kGather;
  int access = 0;
  int slot = 0;  // kGather: which of the two gather buffers (alternating)
  bool operator==(const CommItem&) const = default;
};

struct CommSequenceOptions {
  bool host_budget_unlimited = false;  // no host budget: params never wait for cache space
  bool device_collectives = false;     // collectives run in device memory
};

// The step's collectives: one gather per param load (access order), one reduce-scatter per
// backward access (access order), then the norm. The same on every rank (a function of
// rank-independent plans), and never makes the comm thread wait for something that waits
// for a later collective; a gather moves ahead of a reduce-scatter only where the plans
// show it cannot wait for it.
std::vector<CommItem> PlanCommSequence(const std::vector<Access>& schedule,
                                       const DevicePlan& device, const HostPlan& host,
                                       const CommSequenceOptions& options);

}  // namespace strata::engine_internal
