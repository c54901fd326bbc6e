// Placement: the home of every component, the host cache's capacity and the minimum budgets.
//
// The minimums are thresholds, not optima. Whether a host plan fits a capacity is not
// monotonic in the capacity (first-fit placement and Belady's evictions both change with
// it), so the bisection in MinCacheCapacity finds a capacity that plans, not necessarily the
// smallest one. What holds, and what tests/engine/plan_test.cc checks over random models,
// schedules and budgets: every budget below a reported minimum is refused, and every budget
// at or above it plans, because the cache is never given a capacity that was not planned
// (CapacityFor falls back to the bisection's result, which fits whenever the minimum does).
#include <algorithm>
#include <optional>

#include "engine/plan.h"

namespace strata::engine_internal {

PlanOptions PlanOptionsFrom(const EngineOptions& options, WorkingDtype dtype) {
  PlanOptions p;
  p.schedule = options.schedule;
  p.micro_batches = options.micro_batches;
  p.micro_batch_order = options.micro_batch_order;
  p.clip = options.grad_clip > 0;
  p.speculation = options.speculation;
  p.grad_spill = options.grad_spill;
  p.pipeline = options.pipeline_updates;
  p.dtype = dtype;
  p.bf16_grads = options.grad_dtype == GradDtype::kBf16;
  p.state_format = options.state_format;
  p.master_format = options.master_format;
  p.device_budget = options.device_mem_bytes;
  p.host_budget = options.host_mem_bytes;
  p.nvme = !options.nvme_paths.empty();
  p.nvme_folders = int(options.nvme_paths.size());
  p.nvme_stripe_bytes = options.nvme_stripe_bytes;
  p.durable = options.durable || options.resume;
  p.rank = options.rank;
  p.world_size = options.world_size;
  p.collectives = options.comm ? options.collective_memory : CollectiveMemory::kAuto;
  p.nvme_read_bps = options.ExpectedNvmeReadBps();
  p.nvme_write_bps = options.ExpectedNvmeWriteBps();
  p.h2d_bps = options.ExpectedH2dBps();
  p.d2h_bps = options.ExpectedD2hBps();
  p.activation_bytes = options.activation_count > 0 ? options.activation_bytes : 0;
  p.activation_count = options.activation_bytes > 0 ? options.activation_count : 0;
  return p;
}

uint64_t SwapCapacity(uint64_t nvme_bytes, uint64_t stripe_bytes, int folders,
                      uint64_t largest_extent) {
  return 2 * nvme_bytes + 2 * stripe_bytes * uint64_t(folders) + (16ull << 20) +
         2 * RoundUp(largest_extent, 4096);
}

uint64_t SwapFileBytes(uint64_t capacity_bytes, uint64_t stripe_bytes, int folders) {
  if (folders <= 0 || stripe_bytes == 0) return 0;
  const uint64_t n = uint64_t(folders);
  const uint64_t stripes = (RoundUp(capacity_bytes, 4096) + stripe_bytes - 1) / stripe_bytes;
  return (stripes + n - 1) / n * stripe_bytes * n;
}

HostPlanInput HostInputFor(const PlacementPlan& pp) {
  HostPlanInput hin;
  hin.schedule = &pp.schedule;
  hin.device = &pp.device;
  hin.blocks = int(pp.param_bytes.size());
  hin.micro_batches = pp.micro_batches;
  hin.clip = pp.clip;
  hin.speculative = pp.speculation;
  hin.restorable = pp.restorable;
  hin.spill_grads = pp.spill_grads;
  hin.pipelined = pp.pipeline;
  hin.separate_param = pp.separate_param;
  hin.obj_bytes = pp.obj_bytes;
  hin.cached = pp.cached;
  hin.capacity = pp.cache_capacity;
  hin.start_offset.assign(pp.obj_bytes.size(), 0);
  return hin;
}

namespace {

constexpr uint64_t kPage = 4096;

// Per block: every state that exists has a committed version on NVMe (cached, so NVMe is its
// home, or durable), so a speculative update can be redone from it.
std::vector<bool> Restorable(const HostPlanInput& in, bool durable) {
  std::vector<bool> r(in.blocks, true);
  for (int b = 0; b < in.blocks; ++b) {
    for (Component c :
         {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq, Component::kParam}) {
      const int o = ObjIndex(b, c);
      if (in.obj_bytes[o] > 0 && !in.cached[o] && !durable) r[b] = false;
    }
  }
  return r;
}

// A cache capacity (whole pages) for which PlanHost succeeds: bisection between 0 and
// everything cacheable, keeping the upper end at a capacity that planned. Feasibility is not
// monotonic, so the result is a capacity that works, possibly above the smallest that does.
// OutOfMemory when even everything cacheable does not plan.
Result<uint64_t> MinCacheCapacity(HostPlanInput in) {
  uint64_t lo = 0, hi = 0;
  for (size_t o = 0; o < in.cached.size(); ++o) hi += in.cached[o] ? in.obj_bytes[o] : 0;
  in.capacity = hi;
  STRATA_RETURN_IF_ERROR(PlanHost(in).status());
  while (hi - lo > kPage) {
    const uint64_t mid = RoundUp((lo + hi) / 2, kPage);
    if (mid >= hi) break;
    in.capacity = mid;
    if (PlanHost(in).ok()) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

// The cache capacity to run with, given `room` for it: the most it can use (whole pages,
// never more than everything it could hold at once) when the host plan works there, else
// MinCacheCapacity's result when that fits the room. nullopt when neither does.
Result<std::optional<uint64_t>> CapacityFor(HostPlanInput in, const std::vector<bool>& cached,
                                            uint64_t room) {
  in.cached = cached;
  uint64_t cacheable = 0;
  for (size_t o = 0; o < cached.size(); ++o) cacheable += cached[o] ? in.obj_bytes[o] : 0;
  in.capacity = std::min(room, cacheable) / kPage * kPage;
  if (PlanHost(in).ok()) return std::optional<uint64_t>(in.capacity);
  STRATA_ASSIGN_OR_RETURN(const uint64_t least, MinCacheCapacity(in));
  if (least <= room) return std::optional<uint64_t>(least);
  return std::optional<uint64_t>();
}

std::string BlockList(const std::vector<int>& blocks) {
  // "0-5, 9"
  std::string s;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i;
    while (j + 1 < blocks.size() && blocks[j + 1] == blocks[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(blocks[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(blocks[j]);
    }
    i = j + 1;
  }
  return s;
}

// What the steps of PlanPlacement share.
struct Placer {
  Placer(const std::vector<BlockLayout>& l, const PlanOptions& o)
      : layout(l),
        opt(o),
        blocks(int(l.size())),
        separate(o.dtype != WorkingDtype::kFp32 && o.master_format == MasterFormat::kFp32),
        speculation(o.clip && o.nvme && o.speculation != Speculation::kOff),
        may_spill(o.clip && o.nvme && o.grad_spill != GradSpill::kOff) {}

  const std::vector<BlockLayout>& layout;
  const PlanOptions& opt;
  const int blocks;
  const bool separate;     // the param component exists (bf16 params beside an fp32 master)
  const bool speculation;  // some step may update speculatively
  const bool may_spill;    // gradients may go to NVMe
  std::vector<uint64_t> param_bytes, grad_bytes;
  std::string device_short_message;  // non-empty: the device budget is below its minimum
  uint64_t largest_f32 = 0;          // the largest fp32 state object
  uint64_t largest_step = 0;         // the largest block's master, moments and gradient
  std::vector<int> state_objs;  // master/param first (most traffic saved per byte), then moments
  uint64_t state_bytes = 0;
  std::vector<Access> schedule;
  DevicePlan device;
  HostPlanInput hin;
  PlacementPlan pp;

  Status SizeObjects();
  void AddCommStaging();
  // SizeObjects, AddCommStaging and the host plan input with only gradients cached.
  Status Prepare();
  // The least host budget that plans: with every state on NVMe when opt.nvme, else with
  // every state at home in host memory.
  Result<uint64_t> HostMinimum();
  Status PlaceAllOnHost(uint64_t cache_min_host);
  Status PlaceWithNvme();
  Status PredictTraffic();

  // Whether steps may speculate (PlacementPlan::speculation, restorable), with the reason.
  void PlanSpeculation();
  // Whether the updates that wait for the norm run under the next step's forward
  // (PlacementPlan::pipeline), with the reason.
  void PlanPipeline();
};

// Object sizes, the device minimum and the device plan.
Status Placer::SizeObjects() {
  const uint64_t work_elem = opt.dtype == WorkingDtype::kBf16 ? 2 : 4;
  const StateFormats formats{opt.state_format, opt.master_format};
  const uint32_t moment_elem = MomentElemBytes(opt.state_format);
  pp.elem_bytes[int(Component::kParam)] = uint32_t(work_elem);
  pp.elem_bytes[int(Component::kMaster)] = MasterElemBytes(opt.master_format);
  pp.elem_bytes[int(Component::kExpAvg)] = moment_elem;
  pp.elem_bytes[int(Component::kExpAvgSq)] = moment_elem;
  pp.state.clear();
  const int n_obj = blocks * kNumComponents;
  pp.home.assign(n_obj, Tier::kHost);
  pp.obj_bytes.assign(n_obj, 0);
  pp.cached.assign(n_obj, false);
  param_bytes.assign(blocks, 0);
  grad_bytes.assign(blocks, 0);
  uint64_t device_min = 0;
  int largest_block = 0;
  for (int b = 0; b < blocks; ++b) {
    const uint64_t s = layout[b].shard_numel;
    // The device holds the whole flat buffer (all shards, gathered when world_size > 1).
    param_bytes[b] = layout[b].padded_numel * work_elem;
    grad_bytes[b] = layout[b].padded_numel * 4;
    const uint64_t need = RoundUp(param_bytes[b], 256) + RoundUp(grad_bytes[b], 256);
    if (need > device_min) device_min = need, largest_block = b;
    const uint64_t f32 = RoundUp(s * 4, kPage);
    largest_f32 = std::max(largest_f32, f32);
    // The state's extents as strata/state_layout.h lays them out (int8: codes and scales).
    pp.state.push_back(DescribeBlockState(layout[b], opt.rank, opt.world_size, formats));
    for (Component c : {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq}) {
      pp.obj_bytes[ObjIndex(b, c)] = RoundUp(pp.state[b].Extent(c)->bytes, kPage);
    }
    pp.obj_bytes[ObjIndex(b, Component::kGrad)] = RoundUp(s * 4, kPage);
    largest_step = std::max(largest_step, f32 + pp.obj_bytes[ObjIndex(b, Component::kMaster)] +
                                              2 * pp.obj_bytes[ObjIndex(b, Component::kExpAvg)]);
    if (separate) pp.obj_bytes[ObjIndex(b, Component::kParam)] = RoundUp(s * 2, kPage);
    pp.cached[ObjIndex(b, Component::kGrad)] = true;
  }
  PlacementReport& rep = pp.report;
  rep.dtype = opt.dtype;
  rep.state_format = opt.state_format;
  rep.master_format = opt.master_format;
  rep.device_budget_bytes = opt.device_budget;
  rep.device_min_bytes = device_min;
  rep.host_budget_bytes = opt.host_budget;
  // A short device budget is reported with a short host budget, when both are (below).
  const bool device_short = opt.device_budget && opt.device_budget < device_min;
  if (device_short) {
    device_short_message = std::string("device budget ") + FormatBytes(opt.device_budget) +
                           " is smaller than block '" + layout[largest_block].name +
                           "' needs during backward (params " +
                           FormatBytes(param_bytes[largest_block]) + " + gradient buffer " +
                           FormatBytes(grad_bytes[largest_block]) + "); need at least " +
                           FormatBytesExact(device_min);
  }
  STRATA_ASSIGN_OR_RETURN(
      schedule, BuildSchedule(blocks, opt.schedule, opt.micro_batches, opt.micro_batch_order));
  STRATA_ASSIGN_OR_RETURN(device, PlanDevice(schedule, param_bytes, grad_bytes,
                                             device_short ? device_min : opt.device_budget));
  for (int b = 0; b < blocks; ++b) {
    if (separate) state_objs.push_back(ObjIndex(b, Component::kParam));
    state_objs.push_back(ObjIndex(b, Component::kMaster));
  }
  for (int b = 0; b < blocks; ++b) {
    state_objs.push_back(ObjIndex(b, Component::kExpAvg));
    state_objs.push_back(ObjIndex(b, Component::kExpAvgSq));
  }
  for (int o : state_objs) state_bytes += pp.obj_bytes[o];
  return Status::OK();
}

// Staging outside the cache: gradient accumulation, and the collectives' host buffers.
void Placer::AddCommStaging() {
  pp.staging_bytes = opt.micro_batches > 1 ? largest_f32 : 0;
  PlacementReport& rep = pp.report;
  rep.collective_memory = opt.collectives;
  const std::string ranks = "rank " + std::to_string(opt.rank) + " of " +
                            std::to_string(opt.world_size) + ": holds 1/" +
                            std::to_string(opt.world_size) + " of every state; ";
  if (opt.collectives == CollectiveMemory::kDevice) {
    rep.reasons.push_back(ranks +
                          "collectives in device memory, in place (H2D and D2H carry this "
                          "rank's 1/" +
                          std::to_string(opt.world_size) + " of each block; no host staging)");
  }
  if (opt.collectives != CollectiveMemory::kHost) return;
  // Collectives in host memory: two full-block gather buffers (the all-gather of the next
  // block fills one while the H2D copy of the current one reads the other) and one
  // full-block gradient landing buffer (the reduce-scatter's input). They are host memory
  // like the rest, so they count against the host budget.
  uint64_t gather = 0, landing = 0;
  for (int b = 0; b < blocks; ++b) {
    gather = std::max(gather, RoundUp(param_bytes[b], kPage));
    landing = std::max(landing, RoundUp(grad_bytes[b], kPage));
  }
  pp.comm_staging_bytes = 2 * gather + landing;
  pp.gather_bytes = gather;
  pp.staging_bytes += pp.comm_staging_bytes;
  rep.reasons.push_back(
      ranks + "host staging for the collectives: 2 full-block gather buffers of " +
      FormatBytes(gather) + " and a gradient landing buffer of " + FormatBytes(landing));
}

Status Placer::Prepare() {
  STRATA_RETURN_IF_ERROR(SizeObjects());
  AddCommStaging();
  hin.schedule = &schedule;
  hin.device = &device;
  hin.blocks = blocks;
  hin.micro_batches = opt.micro_batches;
  hin.clip = opt.clip;
  hin.separate_param = separate;
  hin.obj_bytes = pp.obj_bytes;
  hin.cached = pp.cached;  // only gradients in the cache
  return Status::OK();
}

Result<uint64_t> Placer::HostMinimum() {
  HostPlanInput in = hin;
  if (opt.nvme) {
    for (int o : state_objs) in.cached[o] = true;
    in.spill_grads = may_spill;
    STRATA_ASSIGN_OR_RETURN(const uint64_t cache, MinCacheCapacity(in));
    return cache + pp.staging_bytes;
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t cache, MinCacheCapacity(in));
  return state_bytes + cache + pp.staging_bytes;
}

// The host minimum of `layout` under `opt` (budgets aside), or nullopt when it does not plan.
std::optional<uint64_t> HostMinimumOf(const std::vector<BlockLayout>& layout,
                                      const PlanOptions& opt) {
  Placer p(layout, opt);
  if (!p.Prepare().ok()) return std::nullopt;
  auto min = p.HostMinimum();
  return min.ok() ? std::optional<uint64_t>(*min) : std::nullopt;
}

// The other ways to meet a host budget below `need` (the minimum with these options), each
// with its own minimum, in the flags' words ("; or --grad-clip 0 (...): 27.2 MiB"): those
// that need less than `need`, --nvme always, and all of them together when that needs less
// than each alone.
std::string WaysToMeetHost(const std::vector<BlockLayout>& layout, const PlanOptions& opt,
                           uint64_t need) {
  struct Way {
    bool applies;
    const char* flag;
    const char* why;
    void (*change)(PlanOptions*);
  };
  const Way ways[] = {
      {!opt.nvme, "--nvme DIR", "states on NVMe, in host memory while in use",
       [](PlanOptions* o) { o->nvme = true; }},
      {opt.clip, "--grad-clip 0", "each gradient freed after its update, not held for the norm",
       [](PlanOptions* o) { o->clip = false; }},
      {opt.clip && opt.nvme && opt.grad_spill == GradSpill::kOff, "--grad-spill auto",
       "gradients written to NVMe, not held in host memory for the norm",
       [](PlanOptions* o) { o->grad_spill = GradSpill::kAuto; }},
      {opt.micro_batches > 1, "--micro-batches 1",
       "with a larger --batch: no gradient held across micro-batches",
       [](PlanOptions* o) { o->micro_batches = 1; }},
      {opt.state_format == StateFormat::kFp32, "--state-dtype bf16",
       "Adam moments in bf16: 8 bytes of state per parameter instead of 12",
       [](PlanOptions* o) { o->state_format = StateFormat::kBf16; }},
      {opt.master_format == MasterFormat::kFp32 && opt.dtype == WorkingDtype::kBf16,
       "--master-dtype bf16", "master weights in bf16, as the device's params: 2 bytes fewer",
       [](PlanOptions* o) { o->master_format = MasterFormat::kBf16Stochastic; }},
  };
  std::string out, together;
  PlanOptions all = opt;
  all.host_budget = 0;
  uint64_t best_alone = need;
  int applying = 0;
  for (const Way& w : ways) {
    if (!w.applies) continue;
    PlanOptions o = opt;
    o.host_budget = 0;
    w.change(&o);
    w.change(&all);
    together += std::string(applying++ ? " and " : "") + w.flag;
    const std::optional<uint64_t> min = HostMinimumOf(layout, o);
    if (!min) continue;
    best_alone = std::min(best_alone, *min);
    if (*min < need || w.change == ways[0].change) {  // --nvme: always
      out += "; or " + std::string(w.flag) + " (" + w.why + "): " + FormatBytes(*min);
    }
  }
  if (applying > 1) {
    const std::optional<uint64_t> min = HostMinimumOf(layout, all);
    if (min && *min < best_alone) out += "; or " + together + ": " + FormatBytes(*min);
  }
  return out;
}

// Every state's home is host memory; only gradients go through the cache.
Status Placer::PlaceAllOnHost(uint64_t cache_min_host) {
  PlacementReport& rep = pp.report;
  const uint64_t all_host_min = state_bytes + cache_min_host + pp.staging_bytes;
  rep.host_min_bytes = all_host_min;
  if (opt.host_budget != 0 && opt.host_budget < all_host_min) {
    return Status::OutOfMemory("host budget " + FormatBytes(opt.host_budget) +
                               " cannot hold the model states without NVMe: they need " +
                               FormatBytes(state_bytes) + " plus " +
                               FormatBytes(cache_min_host + pp.staging_bytes) +
                               " for gradients; need at least " + FormatBytesExact(all_host_min) +
                               " of --host-mem" + WaysToMeetHost(layout, opt, all_host_min));
  }
  if (opt.durable && !opt.nvme) {
    return Status::InvalidArgument("durable/resume needs NVMe paths to commit the state to");
  }
  pp.resident_bytes = state_bytes;
  uint64_t all_grads = 0;
  for (int b = 0; b < blocks; ++b) all_grads += pp.obj_bytes[ObjIndex(b, Component::kGrad)];
  hin.spill_grads = may_spill && opt.grad_spill == GradSpill::kOn;
  STRATA_ASSIGN_OR_RETURN(
      const std::optional<uint64_t> capacity,
      CapacityFor(hin, pp.cached,
                  opt.host_budget ? opt.host_budget - state_bytes - pp.staging_bytes : all_grads));
  if (!capacity) return Status::Aborted("internal: the validated gradient cache does not fit");
  pp.cache_capacity = *capacity;
  rep.reasons.push_back(
      "every component's home is host memory (" +
      std::string(opt.host_budget ? "the host budget holds them all" : "no host budget given") +
      ")" + (opt.durable ? "; each step also commits them to NVMe" : ""));
  return Status::OK();
}

// States live on NVMe and in the host cache; what the budget holds beyond the cache's
// minimum and a prefetch window becomes host homes.
Status Placer::PlaceWithNvme() {
  PlacementReport& rep = pp.report;
  std::vector<bool> cached_all = pp.cached;
  for (int o : state_objs) cached_all[o] = true;
  hin.cached = cached_all;
  // Gradients held in host memory (no NVMe writes) when the budget holds them beside the
  // states' cache; else written to NVMe (the smaller minimum).
  hin.spill_grads = false;
  const Result<uint64_t> hold_min = MinCacheCapacity(hin);
  hin.spill_grads = may_spill;
  STRATA_ASSIGN_OR_RETURN(const uint64_t least_cache, MinCacheCapacity(hin));
  const uint64_t host_min = least_cache + pp.staging_bytes;
  rep.host_min_bytes = host_min;
  const uint64_t room = opt.host_budget > pp.staging_bytes ? opt.host_budget - pp.staging_bytes : 0;
  if (may_spill && opt.grad_spill == GradSpill::kAuto && hold_min.ok() && room >= *hold_min) {
    hin.spill_grads = false;
  }
  const uint64_t cache_min_nvme = hin.spill_grads || !hold_min.ok() ? least_cache : *hold_min;
  if (opt.host_budget < host_min) {
    return Status::OutOfMemory(
        "host budget " + FormatBytes(opt.host_budget) +
        " is too small even with every state on NVMe: the host must stage the optimizer "
        "step of the largest block (master, exp_avg, exp_avg_sq and gradient, " +
        FormatBytes(largest_step) + ")" +
        (!hin.spill_grads && (hin.clip || opt.micro_batches > 1)
             ? " while holding every block's gradient until the update"
             : std::string()) +
        (pp.staging_bytes ? " plus " + FormatBytes(pp.staging_bytes) + " of staging" : "") +
        "; need at least " + FormatBytesExact(host_min) + " of --host-mem" +
        WaysToMeetHost(layout, opt, host_min));
  }
  // Keep a prefetch window beyond the minimum (two more optimizer steps' states, so the
  // reads of the next updates overlap the writes of the last ones), then give host
  // homes to the components that save the most NVMe traffic per byte.
  const uint64_t budget = opt.host_budget - pp.staging_bytes;
  const uint64_t window = std::min(budget, cache_min_nvme + 6 * largest_f32);
  std::vector<bool> cached = cached_all;
  uint64_t resident = 0;
  for (int o : state_objs) {
    if (resident + pp.obj_bytes[o] + window > budget) continue;
    cached[o] = false;
    resident += pp.obj_bytes[o];
  }
  // The cache gets the rest of the budget. Fewer cached objects rarely need more cache,
  // but when no capacity that fits works, give a host home back to NVMe and retry; with
  // every state cached, the minimum found above fits by construction.
  for (;;) {
    STRATA_ASSIGN_OR_RETURN(const std::optional<uint64_t> capacity,
                            CapacityFor(hin, cached, budget - resident));
    if (capacity) {
      pp.cache_capacity = *capacity;
      break;
    }
    int last = -1;
    for (int o : state_objs) {
      if (!cached[o]) last = o;
    }
    if (last < 0) {
      return Status::Aborted("internal: no host cache capacity within " + FormatBytes(budget) +
                             " works, though " + FormatBytes(cache_min_nvme) + " did");
    }
    cached[last] = true;
    resident -= pp.obj_bytes[last];
  }
  pp.cached = cached;
  pp.resident_bytes = resident;
  pp.use_nvme = true;
  std::vector<int> host_blocks[kNumComponents], nvme_blocks[kNumComponents];
  for (int o : state_objs) {
    (cached[o] ? nvme_blocks : host_blocks)[int(ObjComponent(o))].push_back(ObjBlock(o));
  }
  rep.reasons.push_back(
      "host cache " + FormatBytes(pp.cache_capacity) + " (minimum " + FormatBytes(cache_min_nvme) +
      ": the largest optimizer step's master, moments and gradient" +
      (hin.spill_grads                     ? "; gradients go to NVMe at their final landing"
       : hin.clip || opt.micro_batches > 1 ? ", plus every gradient held to the update"
                                           : "") +
      "); the rest of the budget holds components at home");
  for (Component c :
       {Component::kParam, Component::kMaster, Component::kExpAvg, Component::kExpAvgSq}) {
    if (!host_blocks[int(c)].empty()) {
      rep.reasons.push_back(std::string(ComponentName(c)) + " of blocks " +
                            BlockList(host_blocks[int(c)]) + ": home host (" +
                            (c == Component::kExpAvg || c == Component::kExpAvgSq
                                 ? "saves one NVMe read and one write per step"
                                 : "saves up to three NVMe reads and one write per step") +
                            ")");
    }
    if (!nvme_blocks[int(c)].empty()) {
      rep.reasons.push_back(std::string(ComponentName(c)) + " of blocks " +
                            BlockList(nvme_blocks[int(c)]) +
                            ": home NVMe (no host budget left; cached in host while in use)");
    }
  }
  return Status::OK();
}

// Predicted traffic: replay the steady-state plans. With clipping, the steady state while
// clipping does not apply: speculative where blocks may speculate, unless the updates are
// pipelined and --speculate auto (then no step speculates, and each step carries the last
// one's updates). What a step leaves cached decides the next step's loads, and the plans
// settle into a cycle (of one plan, or of a few where the cached set alternates): the reads
// are the mean over it.
Status Placer::PredictTraffic() {
  PlacementReport& rep = pp.report;
  const bool host_collectives = opt.collectives == CollectiveMemory::kHost;
  hin.cached = pp.cached;
  hin.capacity = pp.cache_capacity;
  hin.speculative = pp.speculation && !(pp.pipeline && opt.speculation == Speculation::kAuto);
  hin.pipelined = pp.pipeline && !hin.speculative;
  hin.restorable = pp.restorable;
  hin.spill_grads = pp.spill_grads;
  STRATA_ASSIGN_OR_RETURN(const SteadyPlans replay, ReplayToSteadyState(hin));
  const std::vector<HostPlan>& plans = replay.plans;
  const size_t cycle = replay.cycle;
  const HostPlan& steady = plans[cycle];
  int device_loads = 0;
  for (int a = 0; a < int(schedule.size()); ++a) {
    if (device.steps[a].load) {
      // In device memory, each rank copies its shard and the gather fills in the rest.
      rep.predicted_bytes.h2d +=
          param_bytes[schedule[a].block] / (host_collectives ? 1 : uint64_t(opt.world_size));
      if (schedule[a].pass == Pass::kBackward) ++device_loads;
    }
    if (schedule[a].pass == Pass::kBackward) {
      // bf16 gradients cross as two bytes per value (with ranks: the whole block, in host
      // memory).
      rep.predicted_bytes.d2h += grad_bytes[schedule[a].block] / (opt.bf16_grads ? 2 : 1) /
                                 (host_collectives ? 1 : uint64_t(opt.world_size));
    }
  }
  uint64_t reads = 0;
  for (size_t k = cycle; k < plans.size(); ++k) {
    for (const HostOp& op : plans[k].ops) {
      const bool grad = ObjComponent(op.obj) == Component::kGrad;
      if (op.kind == HostOpKind::kLoad &&
          (grad ? pp.spill_grads : pp.home[op.obj] == Tier::kNvme)) {
        reads += pp.DataBytes(layout, op.obj);
      }
    }
  }
  rep.predicted_bytes.nvme_read = reads / (plans.size() - cycle);
  if (pp.spill_grads) {
    for (int b = 0; b < blocks; ++b) {
      rep.predicted_bytes.nvme_write += pp.DataBytes(layout, ObjIndex(b, Component::kGrad));
    }
  }
  for (int u : steady.opt_uses) {
    for (const UseObj& uo : steady.uses[u].objs) {
      if (ObjComponent(uo.obj) != Component::kGrad && pp.obj_bytes[uo.obj] &&
          (pp.home[uo.obj] == Tier::kNvme || opt.durable)) {
        rep.predicted_bytes.nvme_write += pp.DataBytes(layout, uo.obj);
      }
    }
  }
  rep.reasons.push_back("device: " + std::to_string(device_loads) + " of " +
                        std::to_string(blocks) +
                        " blocks' params copied again in backward per micro-batch set (" +
                        (opt.device_budget ? "budget holds " + FormatBytes(opt.device_budget)
                                           : std::string("no device budget")) +
                        "; evicting the block needed farthest ahead)");
  const std::pair<double, const char*> times[] = {
      {rep.predicted_bytes.nvme_read / opt.nvme_read_bps, "nvme_read"},
      {rep.predicted_bytes.nvme_write / opt.nvme_write_bps, "nvme_write"},
      {rep.predicted_bytes.h2d / opt.h2d_bps, "h2d"},
      {rep.predicted_bytes.d2h / opt.d2h_bps, "d2h"}};
  for (const auto& [t, name] : times) {
    if (t > rep.predicted_bound_seconds) {
      rep.predicted_bound_seconds = t;
      rep.predicted_bound_resource = name;
    }
  }
  return Status::OK();
}

// The budgets are those of the updates that wait for the norm; a speculative step (its
// updates interleaved with backward) may need more cache, so the blocks speculate only when
// its plan fits the capacity chosen.
void Placer::PlanSpeculation() {
  HostPlanInput in = hin;
  in.cached = pp.cached;
  in.capacity = pp.cache_capacity;
  in.spill_grads = pp.spill_grads;
  in.restorable = pp.restorable;
  if (in.restorable.empty()) return;  // no store: nothing has a committed version
  std::vector<int> speculate, wait;
  for (int b = 0; b < blocks; ++b) (in.restorable[b] ? speculate : wait).push_back(b);
  if (speculate.empty()) return;
  in.speculative = true;
  if (!PlanHost(in).ok()) {
    pp.report.reasons.push_back(
        "clipping: every update waits for the global norm (the host cache cannot hold an "
        "update's states beside the gradients still accumulating; more --host-mem lets the "
        "updates run during backward)");
    return;
  }
  pp.speculation = true;
  pp.report.reasons.push_back(
      "clipping: the updates of blocks " + BlockList(speculate) +
      " run during backward, before the global norm (redone from their committed NVMe "
      "versions when clipping applies" +
      (opt.speculation == Speculation::kAuto ? "; after a step that clipped, they wait" : "") +
      ")" +
      (wait.empty() ? std::string()
                    : "; blocks " + BlockList(wait) +
                          " wait for the norm (a host home keeps no previous version)"));
}

// Two steps' plans back to back must fit the cache: the first defers its updates, the
// second runs them before its forward needs each block and defers its own, and a third
// carries those (the steady state). The minimums stay those of updates that wait at the end
// of the step: where pipelining does not fit, the engine keeps that order.
void Placer::PlanPipeline() {
  if (!opt.clip || !opt.pipeline) return;
  if (opt.world_size > 1 && opt.speculation == Speculation::kOn) {
    pp.report.reasons.push_back(
        "clipping: the updates that wait for the global norm run at the end of the step: "
        "with ranks, a speculative step (--speculate on) would update before the step it "
        "carries is committed (the ranks commit it at the end of the next step)");
    return;
  }
  HostPlanInput in = hin;
  in.cached = pp.cached;
  in.spill_grads = pp.spill_grads;
  in.restorable = pp.restorable;
  in.speculative = false;
  in.pipelined = true;
  auto fits = [&](uint64_t capacity) {
    in.capacity = capacity;
    HostPlanInput step = in;
    for (int k = 0; k < 3; ++k) {
      auto plan = PlanHost(step);
      if (!plan.ok()) return false;
      step.carried = plan->deferred;
      step.start_resident = plan->end_resident;
      step.start_offset = plan->offset;
    }
    return true;
  };
  if (fits(pp.cache_capacity)) {
    pp.pipeline = true;
    pp.report.reasons.push_back(
        "clipping: the updates that wait for the global norm run under the next step's "
        "forward, in the order it needs the blocks (the next forward waits only for the block "
        "it acquires; " +
        std::string(opt.world_size > 1
                        ? "the ranks commit the step at the end of the next one, together"
                        : "the commit lands during it") +
        ")" +
        std::string(pp.speculation && opt.speculation == Speculation::kAuto
                        ? "; so no step speculates (--speculate on would, with redos)"
                        : ""));
    return;
  }
  uint64_t lo = pp.cache_capacity, hi = 0;
  for (size_t o = 0; o < pp.cached.size(); ++o) hi += pp.cached[o] ? pp.obj_bytes[o] : 0;
  hi = RoundUp(std::max(hi, lo), kPage);
  std::string need = "more host memory than the states take";
  if (fits(hi)) {
    while (hi - lo > kPage) {
      const uint64_t mid = RoundUp((lo + hi) / 2, kPage);
      if (mid >= hi) break;
      (fits(mid) ? hi : lo) = mid;
    }
    need = "a host cache of " + FormatBytes(hi) +
           (opt.host_budget
                ? " (--host-mem " + FormatBytes(opt.host_budget + (hi - pp.cache_capacity)) + ")"
                : std::string());
  }
  pp.report.reasons.push_back(
      "clipping: the updates that wait for the global norm run at the end of the step, not "
      "under the next step's forward: pipelining them needs " +
      need);
}

}  // namespace

Result<PlacementPlan> PlanStates(const std::vector<BlockLayout>& layout, const PlanOptions& opt) {
  Placer p(layout, opt);
  STRATA_RETURN_IF_ERROR(p.Prepare());
  STRATA_ASSIGN_OR_RETURN(const uint64_t cache_min_host, MinCacheCapacity(p.hin));
  PlacementPlan& pp = p.pp;
  const Status host =
      opt.host_budget == 0 || !opt.nvme ? p.PlaceAllOnHost(cache_min_host) : p.PlaceWithNvme();
  if (!p.device_short_message.empty()) {  // every short budget at once
    const bool host_short = host.code() == StatusCode::kOutOfMemory;
    return Status::OutOfMemory(p.device_short_message +
                               (host_short ? "; and the " + host.message() : std::string()));
  }
  STRATA_RETURN_IF_ERROR(host);
  if (opt.nvme && opt.host_budget == 0) {
    // The minimum reported for an unlimited host budget is given back as --host-mem; with
    // NVMe a budget takes PlaceWithNvme's path, whose minimum (every state cached, in whole
    // pages) can exceed the all-on-host one. Report the one that path accepts.
    PlanOptions bounded = opt;
    bounded.host_budget = 1;
    Placer q(layout, bounded);
    if (q.Prepare().ok() && MinCacheCapacity(q.hin).ok()) {
      (void)q.PlaceWithNvme();  // refuses the budget of 1 after setting its minimum
      if (q.pp.report.host_min_bytes != 0) pp.report.host_min_bytes = q.pp.report.host_min_bytes;
    }
  }
  pp.spill_grads = p.hin.spill_grads;
  pp.use_nvme = pp.use_nvme || opt.durable || pp.spill_grads;
  for (int o : p.state_objs) {
    pp.home[o] = pp.cached[o] ? Tier::kNvme : Tier::kHost;
    if (pp.home[o] == Tier::kNvme || opt.durable) pp.nvme_bytes += pp.obj_bytes[o];
  }
  if (pp.spill_grads) {
    for (int b = 0; b < p.blocks; ++b) pp.nvme_bytes += pp.obj_bytes[ObjIndex(b, Component::kGrad)];
  }
  // Restorable blocks: a speculative update can be redone, and without clipping an update
  // made before a late non-finite gradient undone (the step is then skipped whole).
  if (pp.use_nvme && opt.speculation != Speculation::kOff) {
    HostPlanInput in = p.hin;
    in.cached = pp.cached;
    pp.restorable = Restorable(in, opt.durable);
  }
  if (p.speculation) p.PlanSpeculation();
  if (pp.spill_grads) {
    pp.report.reasons.push_back(
        "gradients: written to NVMe at their final landing and reloaded for a deferred update "
        "or a redo" +
        std::string(opt.grad_spill == GradSpill::kOn
                        ? " (--grad-spill on)"
                        : " (the host budget cannot also hold them all until the norm)"));
  }
  // Objects are whole 4 KiB pages, so a partial page of cache is never used; dropping it
  // keeps the pinned pool (which rounds up to pages) inside the budget.
  pp.cache_capacity = pp.cache_capacity / kPage * kPage;
  p.PlanPipeline();
  PlacementReport& rep = pp.report;
  rep.host_resident_bytes = pp.resident_bytes;
  rep.host_cache_bytes = pp.cache_capacity + pp.staging_bytes;
  rep.nvme_bytes = pp.nvme_bytes;
  if (pp.use_nvme) {
    uint64_t largest = 0;
    for (size_t o = 0; o < pp.obj_bytes.size(); ++o) {
      const bool grad = ObjComponent(int(o)) == Component::kGrad;
      if (grad ? pp.spill_grads : pp.home[o] == Tier::kNvme || opt.durable) {
        largest = std::max(largest, pp.obj_bytes[o]);
      }
    }
    pp.swap_capacity_bytes =
        SwapCapacity(pp.nvme_bytes, opt.nvme_stripe_bytes, opt.nvme_folders, largest);
    rep.nvme_file_bytes =
        SwapFileBytes(pp.swap_capacity_bytes, opt.nvme_stripe_bytes, opt.nvme_folders);
    rep.nvme_stripe_bytes = opt.nvme_stripe_bytes;
    rep.nvme_folders = opt.nvme_folders;
  }
  for (int b = 0; b < p.blocks; ++b) {
    for (int c = 0; c < kNumComponents; ++c) {
      const int o = ObjIndex(b, Component(c));
      if (pp.obj_bytes[o] == 0) continue;
      rep.components.push_back(ComponentPlacement{b, Component(c), pp.home[o], pp.obj_bytes[o]});
    }
  }
  STRATA_RETURN_IF_ERROR(p.PredictTraffic());
  pp.schedule = std::move(p.schedule);
  pp.device = std::move(p.device);
  pp.param_bytes = std::move(p.param_bytes);
  pp.grad_bytes = std::move(p.grad_bytes);
  pp.micro_batches = opt.micro_batches;
  pp.clip = opt.clip;
  pp.separate_param = p.separate;
  return std::move(pp);
}

}  // namespace strata::engine_internal
