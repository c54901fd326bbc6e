#include "engine/plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "io/range_allocator.h"

namespace strata::engine_internal {

Result<std::vector<BlockLayout>> ComputeLayout(const std::vector<BlockSpec>& blocks,
                                               uint32_t tensor_alignment, int world_size) {
  if (tensor_alignment == 0) return Status::InvalidArgument("tensor_alignment must be >= 1");
  if (world_size < 1) return Status::InvalidArgument("world_size must be >= 1");
  if (blocks.empty()) return Status::InvalidArgument("a model needs at least one block");
  std::vector<BlockLayout> out;
  std::set<std::string> block_names;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const BlockSpec& spec = blocks[bi];
    if (spec.name.empty()) {
      return Status::InvalidArgument("block " + std::to_string(bi) + " has an empty name");
    }
    if (!block_names.insert(spec.name).second) {
      return Status::InvalidArgument("two blocks are named '" + spec.name + "'");
    }
    if (spec.tensors.empty()) {
      return Status::InvalidArgument("block '" + spec.name + "' has no tensors");
    }
    BlockLayout bl;
    bl.name = spec.name;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const TensorSpec& t : spec.tensors) {
      if (t.name.empty() || !names.insert(t.name).second) {
        return Status::InvalidArgument("block '" + spec.name + "': tensor name '" + t.name +
                                       "' is empty or repeated");
      }
      if (t.shape.empty()) {
        return Status::InvalidArgument("tensor '" + spec.name + "." + t.name +
                                       "' has no shape (a scalar is {1})");
      }
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d < 1) {
          return Status::InvalidArgument("tensor '" + spec.name + "." + t.name +
                                         "' has dimension " + std::to_string(d) +
                                         "; every dimension must be >= 1");
        }
        numel *= uint64_t(d);
      }
      offset = RoundUp(offset, tensor_alignment);
      bl.tensors.push_back(TensorLayout{t.name, t.shape, offset, numel, t.weight_decay, t.group});
      offset += numel;
      bl.numel += numel;
    }
    // Each shard is a whole number of alignment units, so shards start aligned too.
    bl.padded_numel = RoundUp(offset, uint64_t(tensor_alignment) * uint64_t(world_size));
    bl.shard_numel = bl.padded_numel / uint64_t(world_size);
    out.push_back(std::move(bl));
  }
  return out;
}

std::vector<Access> StandardSchedule(int blocks, int micro_batches) {
  std::vector<Access> s;
  for (int m = 0; m < micro_batches; ++m) {
    for (int b = 0; b < blocks; ++b) s.push_back({b, Pass::kForward, m});
    for (int b = blocks - 1; b >= 0; --b) s.push_back({b, Pass::kBackward, m});
  }
  return s;
}

namespace {

// One micro-batch's order, checked: InvalidArgument naming the entry that breaks it.
Status CheckOrder(int blocks, const std::vector<ScheduleEntry>& order) {
  std::vector<int> fwd_at(blocks, -1), bwd_at(blocks, -1);
  for (size_t i = 0; i < order.size(); ++i) {
    const ScheduleEntry& e = order[i];
    const std::string where = "schedule entry " + std::to_string(i) + " (block " +
                              std::to_string(e.block) + ", " +
                              (e.pass == Pass::kForward ? "forward" : "backward") + ")";
    if (e.block < 0 || e.block >= blocks) {
      return Status::InvalidArgument(where + ": the model has " + std::to_string(blocks) +
                                     " blocks");
    }
    int& at = e.pass == Pass::kForward ? fwd_at[e.block] : bwd_at[e.block];
    if (at >= 0) {
      return Status::InvalidArgument(where + " repeats entry " + std::to_string(at) +
                                     "; each block appears once per pass");
    }
    at = int(i);
    if (e.pass == Pass::kBackward && fwd_at[e.block] < 0) {
      return Status::InvalidArgument(where + " comes before that block's forward");
    }
  }
  for (int b = 0; b < blocks; ++b) {
    if (fwd_at[b] < 0 || bwd_at[b] < 0) {
      return Status::InvalidArgument("schedule has no " +
                                     std::string(fwd_at[b] < 0 ? "forward" : "backward") +
                                     " access of block " + std::to_string(b));
    }
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<Access>> BuildSchedule(int blocks, const std::vector<ScheduleEntry>& order,
                                          int micro_batches, MicroBatchOrder micro_order) {
  std::vector<ScheduleEntry> one = order;
  if (one.empty()) {
    for (const Access& a : StandardSchedule(blocks, 1)) one.push_back({a.block, a.pass});
  } else {
    STRATA_RETURN_IF_ERROR(CheckOrder(blocks, one));
  }
  std::vector<Access> s;
  if (micro_order == MicroBatchOrder::kLayerMajor) {
    for (const ScheduleEntry& e : one) {
      for (int m = 0; m < micro_batches; ++m) s.push_back({e.block, e.pass, m});
    }
  } else {
    for (int m = 0; m < micro_batches; ++m) {
      for (const ScheduleEntry& e : one) s.push_back({e.block, e.pass, m});
    }
  }
  return s;
}

std::string DescribeAccess(const Access& a) {
  return std::string(a.pass == Pass::kForward ? "forward" : "backward") + " of block " +
         std::to_string(a.block) + " (micro-batch " + std::to_string(a.micro) + ")";
}

namespace {
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
}  // namespace

Result<DevicePlan> PlanDevice(const std::vector<Access>& schedule,
                              const std::vector<uint64_t>& param_bytes,
                              const std::vector<uint64_t>& grad_bytes, uint64_t capacity) {
  DevicePlan p;
  const int n = int(schedule.size());
  p.steps.resize(n);
  const uint64_t cap = capacity ? capacity : std::numeric_limits<uint64_t>::max();
  std::vector<int> param_of(param_bytes.size(), -1);
  std::vector<int> resident;
  uint64_t used = 0;
  // Next access of `block` after `a`; kNever when there is none in this step (params of the
  // next step are stale anyway, so "no more use this step" is as good as never).
  auto next_use = [&](int buf, int a) -> int64_t {
    const DevBuffer& d = p.buffers[buf];
    if (d.grad) return kNever;  // a gradient buffer is dead once its access is over
    for (int x = a + 1; x < n; ++x) {
      if (schedule[x].block == d.block) return x;
    }
    return kNever;
  };
  // Among buffers needed equally late, evict the one whose last use is oldest: its work
  // finishes first, so the copy that replaces it waits least (dead gradient buffers wait for
  // their D2H copy, which comes after the compute).
  std::vector<int> last_use;
  for (int a = 0; a < n; ++a) {
    const Access& acc = schedule[a];
    const int b = acc.block;
    const bool need_param = param_of[b] < 0;
    const bool bwd = acc.pass == Pass::kBackward;
    const uint64_t pb = RoundUp(param_bytes[b], 256), gb = RoundUp(grad_bytes[b], 256);
    const uint64_t need = (need_param ? pb : 0) + (bwd ? gb : 0);
    while (used + need > cap) {
      int best = -1;
      int64_t best_key = -1;
      int best_last = 0;
      for (int r : resident) {
        if (r == param_of[b]) continue;
        const int64_t key = next_use(r, a);
        if (key > best_key || (key == best_key && last_use[r] < best_last)) {
          best = r, best_key = key, best_last = last_use[r];
        }
      }
      if (best < 0) {
        return Status::OutOfMemory(
            "device budget " + FormatBytes(capacity) + " cannot hold " + DescribeAccess(acc) +
            ": it needs " + FormatBytes(pb + (bwd ? gb : 0)) + " (params " + FormatBytes(pb) +
            (bwd ? " + gradient buffer " + FormatBytes(gb) : std::string()) + ")");
      }
      resident.erase(std::find(resident.begin(), resident.end(), best));
      used -= p.buffers[best].bytes;
      if (!p.buffers[best].grad) param_of[p.buffers[best].block] = -1;
      p.steps[a].frees.push_back(best);
    }
    if (need_param) {
      p.buffers.push_back(DevBuffer{false, b, pb});
      last_use.push_back(a);
      param_of[b] = int(p.buffers.size()) - 1;
      resident.push_back(param_of[b]);
      used += pb;
      p.steps[a].load = true;
    }
    p.steps[a].param_buffer = param_of[b];
    last_use[param_of[b]] = a;
    if (bwd) {
      p.buffers.push_back(DevBuffer{true, b, gb});
      last_use.push_back(a);
      p.steps[a].grad_buffer = int(p.buffers.size()) - 1;
      resident.push_back(p.steps[a].grad_buffer);
      used += gb;
    }
    p.peak_bytes = std::max(p.peak_bytes, used);
  }
  p.end_frees = resident;
  return p;
}

namespace {

// Block `b`'s update runs before the norm this step.
bool Speculates(const HostPlanInput& in, int b) {
  return in.clip && in.speculative && b < int(in.restorable.size()) && in.restorable[b];
}

// The step's uses of host copies in the order the executors meet them (p.uses, h2d_use,
// grad_use, opt_uses).
void PlanHostUses(const HostPlanInput& in, HostPlan* plan) {
  HostPlan& p = *plan;
  const std::vector<Access>& schedule = *in.schedule;
  const int n_access = int(schedule.size());
  const int n_obj = in.blocks * kNumComponents;
  std::vector<int> seq(n_obj, 0);
  auto add_use = [&](UseKind kind, int block, int access,
                     std::vector<std::pair<int, bool>> objs) -> int {
    HostUse u{kind, block, access, {}};
    for (auto [obj, produce] : objs) u.objs.push_back(UseObj{obj, produce, seq[obj]++});
    p.uses.push_back(std::move(u));
    return int(p.uses.size()) - 1;
  };
  auto opt_objs = [&](int b) {
    std::vector<std::pair<int, bool>> objs = {{ObjIndex(b, Component::kMaster), false},
                                              {ObjIndex(b, Component::kExpAvg), false},
                                              {ObjIndex(b, Component::kExpAvgSq), false},
                                              {ObjIndex(b, Component::kGrad), false}};
    if (in.separate_param) objs.push_back({ObjIndex(b, Component::kParam), true});
    return objs;
  };
  p.h2d_use.assign(n_access, -1);
  p.grad_use.assign(n_access, -1);
  std::vector<int> grads_in(in.blocks, 0);
  std::vector<int> final_order;
  // The next forward needs the blocks in the order of their first access: carried updates
  // run in that order, each before its block's first use.
  std::vector<int> first_access(in.blocks, n_access);
  for (int a = n_access - 1; a >= 0; --a) first_access[schedule[a].block] = a;
  const bool defer = in.pipelined && in.clip && !in.speculative;
  // An optimizer step is placed after the next access's parameter copy: the compute that
  // comes next needs its params more urgently than the update needs its states, so the
  // cache serves (and prefetches) the params first and the update lags by one access.
  std::vector<std::pair<int, int>> pending_opts;  // (block, access)
  size_t next_carried = 0;                        // in.carried placed so far
  auto flush_opts = [&] {
    // After every carried update: the step's own updates wait for the previous commit.
    if (next_carried < in.carried.size()) return;
    for (auto [b, a] : pending_opts)
      p.opt_uses.push_back(add_use(UseKind::kOpt, b, a, opt_objs(b)));
    pending_opts.clear();
  };
  for (int a = 0; a < n_access; ++a) {
    const Access& acc = schedule[a];
    const int b = acc.block;
    while (next_carried < in.carried.size() && first_access[in.carried[next_carried]] <= a) {
      const int c = in.carried[next_carried++];
      p.opt_uses.push_back(add_use(UseKind::kOpt, c, -1, opt_objs(c)));
      p.uses.back().carried = true;
    }
    if (in.device->steps[a].load) {
      const Component src = in.separate_param ? Component::kParam : Component::kMaster;
      p.h2d_use[a] = add_use(UseKind::kH2D, b, a, {{ObjIndex(b, src), false}});
    }
    flush_opts();
    if (acc.pass == Pass::kBackward) {
      const bool first = grads_in[b]++ == 0;
      p.grad_use[a] = add_use(UseKind::kGradIn, b, a, {{ObjIndex(b, Component::kGrad), first}});
      if (grads_in[b] == in.micro_batches) {
        if (in.clip && !Speculates(in, b)) {
          final_order.push_back(b);
        } else {
          pending_opts.push_back({b, a});
        }
      }
    }
  }
  flush_opts();
  if (defer) {
    std::sort(final_order.begin(), final_order.end(),
              [&](int x, int y) { return first_access[x] < first_access[y]; });
    p.deferred = final_order;
    return;
  }
  for (int b : final_order) {
    p.opt_uses.push_back(add_use(UseKind::kOpt, b, n_access - 1, opt_objs(b)));
  }
}

// Belady's key of an object after use i: the index of its next use, counting the next
// step's uses on from n_use (the step repeats), kNever when it is dead.
class NextUse {
 public:
  NextUse(const HostPlanInput& in, const HostPlan& p)
      : n_use_(int(p.uses.size())),
        positions_(size_t(in.blocks) * kNumComponents),
        first_use_(in.blocks, -1),
        deferred_grad_(positions_.size(), false) {
    for (int i = 0; i < n_use_; ++i) {
      for (const UseObj& uo : p.uses[i].objs) positions_[uo.obj].push_back(i);
      if (first_use_[p.uses[i].block] < 0) first_use_[p.uses[i].block] = i;
    }
    for (int b : p.deferred) deferred_grad_[ObjIndex(b, Component::kGrad)] = true;
  }

  int64_t operator()(int obj, int i, bool dead) const {
    if (dead) return kNever;
    const auto& pos = positions_[obj];
    auto it = std::upper_bound(pos.begin(), pos.end(), i);
    if (it != pos.end()) return *it;
    // A deferred update's gradient is next read by that update, which the next step runs
    // just before its block's first use: the earliest blocks' gradients, the last to land,
    // are the ones worth keeping past the step.
    if (deferred_grad_[obj]) return int64_t(n_use_) + first_use_[ObjBlock(obj)];
    if (pos.empty()) return kNever - 1;
    return int64_t(n_use_) + pos.front();  // the same use in the next step
  }

 private:
  const int n_use_;
  std::vector<std::vector<int>> positions_;  // per object: the uses that touch it
  std::vector<int> first_use_;               // per block: its first use in the step
  std::vector<bool> deferred_grad_;          // per object: a deferred update's gradient
};

// The Belady simulation of the cache over p.uses: the host ops (p.ops), every cached
// object's offset, the peak, and what stays resident after the step.
Status SimulateHostCache(const HostPlanInput& in, HostPlan* plan) {
  HostPlan& p = *plan;
  const int n_obj = in.blocks * kNumComponents;
  const int n_use = int(p.uses.size());
  const NextUse next_use(in, p);
  std::vector<bool> resident(n_obj, false), dead(n_obj, false), locked(n_obj, false);
  std::vector<bool> held(n_obj, false);
  std::vector<int> landings(in.blocks, 0);
  std::vector<int> planned(n_obj, 0);
  p.offset.assign(n_obj, 0);
  // First fit over [0, capacity) — the PinnedPool's own allocator: the plan places every
  // object, and the engine puts it at exactly that offset of its cache region, so
  // fragmentation is part of the simulation (an allocation that does not fit contiguously
  // evicts more).
  RangeAllocator free_ranges(in.capacity);
  auto take = [&](uint64_t size, uint64_t* off) -> bool {
    std::optional<uint64_t> found = free_ranges.Allocate(size);
    if (found) *off = *found;
    return found.has_value();
  };
  auto give = [&](uint64_t off, uint64_t size) { free_ranges.Free(off, size); };
  uint64_t used = 0;
  for (int obj : in.start_resident) {
    // Objects carried over keep their place.
    const uint64_t off = in.start_offset[obj];
    if (in.obj_bytes[obj] > 0 && !free_ranges.Claim(off, in.obj_bytes[obj])) {
      return Status::OutOfMemory("host cache " + FormatBytes(in.capacity) +
                                 " cannot hold the objects it starts with");
    }
    p.offset[obj] = off;
    resident[obj] = true;
    used += in.obj_bytes[obj];
  }
  p.peak_bytes = used;
  // A carried gradient that NVMe does not hold stays until its update.
  for (int b : in.carried) locked[ObjIndex(b, Component::kGrad)] = !in.spill_grads;
  for (int i = 0; i < n_use; ++i) {
    const HostUse& u = p.uses[i];
    for (const UseObj& uo : u.objs) {
      if (!in.cached[uo.obj] || resident[uo.obj]) continue;
      const uint64_t need = in.obj_bytes[uo.obj];
      uint64_t off = 0;
      while (!take(need, &off)) {
        int best = -1;
        int64_t best_key = -1;
        for (int o = 0; o < n_obj; ++o) {
          if (!resident[o] || locked[o]) continue;
          bool in_use = false;
          for (const UseObj& x : u.objs) in_use |= x.obj == o;
          if (in_use) continue;
          const int64_t key = next_use(o, i, dead[o]);
          if (key > best_key) best = o, best_key = key;
        }
        if (best < 0) {
          uint64_t use_bytes = 0;
          for (const UseObj& x : u.objs) use_bytes += in.cached[x.obj] ? in.obj_bytes[x.obj] : 0;
          uint64_t locked_bytes = 0;
          for (int o = 0; o < n_obj; ++o) locked_bytes += locked[o] ? in.obj_bytes[o] : 0;
          return Status::OutOfMemory(
              "host cache " + FormatBytes(in.capacity) + " cannot hold the " +
              (u.kind == UseKind::kOpt      ? "optimizer step"
               : u.kind == UseKind::kGradIn ? "gradient"
                                            : "parameter copy") +
              " of block " + std::to_string(u.block) + " (" + FormatBytes(use_bytes) +
              ") next to " + FormatBytes(locked_bytes) + " of gradients waiting for updates");
        }
        p.ops.push_back(HostOp{HostOpKind::kEvict, best, -1, planned[best]});
        resident[best] = false;
        dead[best] = false;
        used -= in.obj_bytes[best];
        give(p.offset[best], in.obj_bytes[best]);
      }
      p.offset[uo.obj] = off;
      p.ops.push_back(
          HostOp{uo.produce ? HostOpKind::kAlloc : HostOpKind::kLoad, uo.obj, i, 0, off});
      resident[uo.obj] = true;
      used += need;
      p.peak_bytes = std::max(p.peak_bytes, used);
    }
    for (const UseObj& uo : u.objs) planned[uo.obj]++;
    const int g = ObjIndex(u.block, Component::kGrad);
    if (u.kind == UseKind::kGradIn) {
      // A spilled gradient is written at its final landing: evictable from then on.
      locked[g] = !(in.spill_grads && ++landings[u.block] == in.micro_batches);
      dead[g] = false;  // a carried update's gradient buffer, landed in again
    }
    if (u.kind == UseKind::kOpt) {
      // A speculative update's gradient stays until the norm is known (a redo may need it),
      // unless NVMe holds it.
      const bool keep = in.clip && !in.spill_grads && !u.carried && Speculates(in, u.block);
      locked[g] = keep;
      held[g] = keep;
      dead[g] = !keep;
    }
  }
  // Gradients are dead after their update: free them, so the next step starts clean (held
  // ones after the step's decision).
  for (int o = 0; o < n_obj; ++o) {
    if (held[o]) {
      p.held.push_back(o);
    } else if (resident[o] && dead[o]) {
      p.ops.push_back(HostOp{HostOpKind::kEvict, o, -1, planned[o]});
      resident[o] = false;
    } else if (resident[o]) {
      p.end_resident.push_back(o);
    }
  }
  return Status::OK();
}

}  // namespace

Result<HostPlan> PlanHost(const HostPlanInput& in) {
  HostPlan p;
  PlanHostUses(in, &p);
  STRATA_RETURN_IF_ERROR(SimulateHostCache(in, &p));
  return p;
}

Result<SteadyPlans> ReplayToSteadyState(const HostPlanInput& in) {
  constexpr size_t kMaxReplay = 16;
  // What a plan starts from: the cached objects, where they sit, the updates it carries.
  struct Start {
    std::vector<int> resident, carried;
    std::vector<uint64_t> offsets;
    bool operator==(const Start&) const = default;
  };
  auto start_of = [](std::vector<int> resident, const std::vector<uint64_t>& offset,
                     std::vector<int> carried) {
    Start s{std::move(resident), std::move(carried), {}};
    std::sort(s.resident.begin(), s.resident.end());
    for (int o : s.resident) s.offsets.push_back(offset[o]);
    return s;
  };
  SteadyPlans r;
  std::vector<Start> starts = {start_of(in.start_resident, in.start_offset, in.carried)};
  HostPlanInput next = in;
  for (;;) {
    auto plan = PlanHost(next);
    if (!plan.ok()) {
      if (r.plans.empty()) return plan.status();
      r.cycle = 0;
      return r;
    }
    r.plans.push_back(std::move(plan).value());
    const HostPlan& last = r.plans.back();
    Start s = start_of(last.end_resident, last.offset, last.deferred);
    const auto seen = std::find(starts.begin(), starts.end(), s);
    if (seen != starts.end() || r.plans.size() == kMaxReplay) {
      r.cycle = seen != starts.end() ? size_t(seen - starts.begin()) : r.plans.size() - 1;
      return r;
    }
    starts.push_back(std::move(s));
    next.start_resident = last.end_resident;
    next.start_offset = last.offset;
    next.carried = last.deferred;
  }
}

}  // namespace strata::engine_internal

namespace strata::engine_internal {

uint64_t PlacementPlan::DataBytes(const std::vector<BlockLayout>& layout, int obj) const {
  const int b = ObjBlock(obj);
  const Component c = ObjComponent(obj);
  if (b < int(state.size())) {
    if (const StateExtent* e = state[b].Extent(c)) return e->bytes;
  }
  return layout[b].shard_numel * elem_bytes[int(c)];
}

}  // namespace strata::engine_internal
