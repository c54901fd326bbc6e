#include "engine/plan.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "io/range_allocator.h"

namespace strata {

const char* ComponentName(Component c) {
  switch (c) {
    case Component::kParam:
      return "param";
    case Component::kMaster:
      return "master";
    case Component::kExpAvg:
      return "exp_avg";
    case Component::kExpAvgSq:
      return "exp_avg_sq";
    case Component::kGrad:
      return "grad";
  }
  return "?";
}

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

const char* WorkingDtypeName(WorkingDtype d) {
  switch (d) {
    case WorkingDtype::kAuto:
      return "auto";
    case WorkingDtype::kFp32:
      return "fp32";
    case WorkingDtype::kBf16:
      return "bf16";
  }
  return "?";
}

const char* CollectiveMemoryName(CollectiveMemory m) {
  switch (m) {
    case CollectiveMemory::kAuto:
      return "auto";
    case CollectiveMemory::kDevice:
      return "device";
    case CollectiveMemory::kHost:
      return "host";
  }
  return "?";
}

const char* ResourceName(Resource r) {
  switch (r) {
    case Resource::kNvmeRead:
      return "nvme_read";
    case Resource::kNvmeWrite:
      return "nvme_write";
    case Resource::kH2D:
      return "h2d";
    case Resource::kD2H:
      return "d2h";
    case Resource::kCpuOptim:
      return "cpu_optim";
    case Resource::kCompute:
      return "compute";
    case Resource::kComm:
      return "comm";
  }
  return "?";
}

std::string PlacementReport::ToString() const {
  std::ostringstream os;
  using engine_internal::FormatBytes;
  os << "# placement: working dtype " << WorkingDtypeName(dtype) << "\n";
  os << "#   device budget " << (device_budget_bytes ? FormatBytes(device_budget_bytes) : "none")
     << " (minimum " << FormatBytes(device_min_bytes) << ")\n";
  os << "#   host budget " << (host_budget_bytes ? FormatBytes(host_budget_bytes) : "unlimited")
     << " (minimum " << FormatBytes(host_min_bytes) << "): homes "
     << FormatBytes(host_resident_bytes) << ", cache/staging " << FormatBytes(host_cache_bytes)
     << "\n";
  os << "#   nvme " << FormatBytes(nvme_bytes) << "\n";
  for (const std::string& r : reasons) os << "#   " << r << "\n";
  os << "#   predicted per step: nvme_read " << FormatBytes(predicted_bytes.nvme_read)
     << ", nvme_write " << FormatBytes(predicted_bytes.nvme_write) << ", h2d "
     << FormatBytes(predicted_bytes.h2d) << ", d2h " << FormatBytes(predicted_bytes.d2h);
  if (predicted_bound_seconds > 0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "; transfer bound %.3f s (%s, compute not included)",
                  predicted_bound_seconds, predicted_bound_resource.c_str());
    os << buf;
  }
  os << "\n";
  return os.str();
}

namespace engine_internal {

std::string FormatBytes(uint64_t bytes) {
  char buf[64];
  const double b = double(bytes);
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ull << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  }
  return buf;
}

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
      bl.tensors.push_back(TensorLayout{t.name, t.shape, offset, numel, t.weight_decay});
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

Result<std::vector<Access>> BuildSchedule(int blocks, const EngineOptions& options) {
  if (options.schedule.empty()) return StandardSchedule(blocks, options.micro_batches);
  std::vector<int> fwd_at(blocks, -1), bwd_at(blocks, -1);
  for (size_t i = 0; i < options.schedule.size(); ++i) {
    const ScheduleEntry& e = options.schedule[i];
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
  std::vector<Access> s;
  for (int m = 0; m < options.micro_batches; ++m) {
    for (const ScheduleEntry& e : options.schedule) s.push_back({e.block, e.pass, m});
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

Result<HostPlan> PlanHost(const HostPlanInput& in) {
  HostPlan p;
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
  // An optimizer step is placed after the next access's parameter copy: the compute that
  // comes next needs its params more urgently than the update needs its states, so the
  // cache serves (and prefetches) the params first and the update lags by one access.
  std::vector<std::pair<int, int>> pending_opts;  // (block, access)
  auto flush_opts = [&] {
    for (auto [b, a] : pending_opts)
      p.opt_uses.push_back(add_use(UseKind::kOpt, b, a, opt_objs(b)));
    pending_opts.clear();
  };
  for (int a = 0; a < n_access; ++a) {
    const Access& acc = schedule[a];
    const int b = acc.block;
    if (in.device->steps[a].load) {
      const Component src = in.separate_param ? Component::kParam : Component::kMaster;
      p.h2d_use[a] = add_use(UseKind::kH2D, b, a, {{ObjIndex(b, src), false}});
    }
    flush_opts();
    if (acc.pass == Pass::kBackward) {
      const bool first = grads_in[b]++ == 0;
      p.grad_use[a] = add_use(UseKind::kGradIn, b, a, {{ObjIndex(b, Component::kGrad), first}});
      if (grads_in[b] == in.micro_batches) {
        if (in.clip) {
          final_order.push_back(b);
        } else {
          pending_opts.push_back({b, a});
        }
      }
    }
  }
  flush_opts();
  for (int b : final_order) {
    p.opt_uses.push_back(add_use(UseKind::kOpt, b, n_access - 1, opt_objs(b)));
  }

  // Belady simulation of the cache.
  const int n_use = int(p.uses.size());
  std::vector<std::vector<int>> positions(n_obj);
  for (int i = 0; i < n_use; ++i) {
    for (const UseObj& uo : p.uses[i].objs) positions[uo.obj].push_back(i);
  }
  auto next_use = [&](int obj, int i, bool dead) -> int64_t {
    if (dead) return kNever;
    const auto& pos = positions[obj];
    auto it = std::upper_bound(pos.begin(), pos.end(), i);
    if (it != pos.end()) return *it;
    if (pos.empty()) return kNever - 1;
    return int64_t(n_use) + pos.front();  // the same use in the next step
  };
  std::vector<bool> resident(n_obj, false), dead(n_obj, false), locked(n_obj, false);
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
    if (u.kind == UseKind::kGradIn) locked[ObjIndex(u.block, Component::kGrad)] = true;
    if (u.kind == UseKind::kOpt) {
      const int g = ObjIndex(u.block, Component::kGrad);
      locked[g] = false;
      dead[g] = true;
    }
  }
  // Gradients are dead after their update: free them, so the next step starts clean.
  for (int o = 0; o < n_obj; ++o) {
    if (resident[o] && dead[o]) {
      p.ops.push_back(HostOp{HostOpKind::kEvict, o, -1, planned[o]});
      resident[o] = false;
    } else if (resident[o]) {
      p.end_resident.push_back(o);
    }
  }
  return p;
}

namespace {

// Smallest cache capacity for which PlanHost succeeds (binary search over a monotone test).
Result<uint64_t> MinCacheCapacity(HostPlanInput in) {
  uint64_t lo = 0, hi = 0;
  for (size_t o = 0; o < in.cached.size(); ++o) hi += in.cached[o] ? in.obj_bytes[o] : 0;
  in.capacity = hi;
  STRATA_RETURN_IF_ERROR(PlanHost(in).status());
  while (hi - lo > 4096) {
    const uint64_t mid = RoundUp((lo + hi) / 2, 4096);
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

std::string BlockList(const std::vector<int>& blocks) {
  // "0-5, 9"
  std::string s;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i;
    while (j + 1 < blocks.size() && blocks[j + 1] == blocks[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(blocks[i]);
    if (j > i) s += "-" + std::to_string(blocks[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

Result<PlacementPlan> PlanPlacement(const PlacementInput& in) {
  const std::vector<BlockLayout>& layout = *in.layout;
  const EngineOptions& opt = *in.options;
  const int L = int(layout.size());
  const bool separate = in.dtype != WorkingDtype::kFp32;
  const uint64_t work_elem = separate ? 2 : 4;
  PlacementPlan pp;
  const int n_obj = L * kNumComponents;
  pp.home.assign(n_obj, Tier::kHost);
  pp.obj_bytes.assign(n_obj, 0);
  pp.cached.assign(n_obj, false);
  std::vector<uint64_t> param_bytes(L), grad_bytes(L);
  uint64_t device_min = 0, largest_f32 = 0;
  int largest_block = 0;
  for (int b = 0; b < L; ++b) {
    const uint64_t s = layout[b].shard_numel;
    // The device holds the whole flat buffer (all shards, gathered when world_size > 1).
    param_bytes[b] = layout[b].padded_numel * work_elem;
    grad_bytes[b] = layout[b].padded_numel * 4;
    const uint64_t need = RoundUp(param_bytes[b], 256) + RoundUp(grad_bytes[b], 256);
    if (need > device_min) device_min = need, largest_block = b;
    const uint64_t f32 = RoundUp(s * 4, 4096);
    largest_f32 = std::max(largest_f32, f32);
    for (Component c :
         {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq, Component::kGrad}) {
      pp.obj_bytes[ObjIndex(b, c)] = f32;
    }
    if (separate) pp.obj_bytes[ObjIndex(b, Component::kParam)] = RoundUp(s * 2, 4096);
    pp.cached[ObjIndex(b, Component::kGrad)] = true;
  }
  PlacementReport& rep = pp.report;
  rep.dtype = in.dtype;
  rep.device_budget_bytes = in.device_budget;
  rep.device_min_bytes = device_min;
  rep.host_budget_bytes = opt.host_mem_bytes;
  if (in.device_budget && in.device_budget < device_min) {
    return Status::OutOfMemory(
        "device budget " + FormatBytes(in.device_budget) + " is smaller than block '" +
        layout[largest_block].name + "' needs during backward (params " +
        FormatBytes(param_bytes[largest_block]) + " + gradient buffer " +
        FormatBytes(grad_bytes[largest_block]) + "); need at least " + FormatBytes(device_min) +
        " (" + std::to_string(device_min) + " bytes)");
  }
  STRATA_ASSIGN_OR_RETURN(const std::vector<Access> schedule, BuildSchedule(L, opt));
  STRATA_ASSIGN_OR_RETURN(DevicePlan dplan,
                          PlanDevice(schedule, param_bytes, grad_bytes, in.device_budget));
  pp.staging_bytes = opt.micro_batches > 1 ? largest_f32 : 0;
  // Engine::Create resolved kAuto: kDevice or kHost with a communicator.
  const bool host_collectives = opt.comm && opt.collective_memory == CollectiveMemory::kHost;
  rep.collective_memory = opt.comm ? opt.collective_memory : CollectiveMemory::kAuto;
  if (opt.comm && !host_collectives) {
    pp.report.reasons.push_back(
        "rank " + std::to_string(opt.rank) + " of " + std::to_string(opt.world_size) +
        ": holds 1/" + std::to_string(opt.world_size) +
        " of every state; collectives in device memory, in place (H2D and D2H carry this "
        "rank's 1/" +
        std::to_string(opt.world_size) + " of each block; no host staging)");
  }
  if (host_collectives) {
    // Collectives in host memory: two full-block gather buffers (the all-gather of the next
    // block fills one while the H2D copy of the current one reads the other) and one
    // full-block gradient landing buffer (the reduce-scatter's input). They are host memory
    // like the rest, so they count against the host budget.
    uint64_t gather = 0, landing = 0;
    for (int b = 0; b < L; ++b) {
      gather = std::max(gather, RoundUp(param_bytes[b], 4096));
      landing = std::max(landing, RoundUp(grad_bytes[b], 4096));
    }
    pp.comm_staging_bytes = 2 * gather + landing;
    pp.gather_bytes = gather;
    pp.staging_bytes += pp.comm_staging_bytes;
    pp.report.reasons.push_back(
        "rank " + std::to_string(opt.rank) + " of " + std::to_string(opt.world_size) +
        ": holds 1/" + std::to_string(opt.world_size) +
        " of every state; host staging for the "
        "collectives: 2 full-block gather buffers of " +
        FormatBytes(gather) + " and a gradient landing buffer of " + FormatBytes(landing));
  }

  HostPlanInput hin;
  hin.schedule = &schedule;
  hin.device = &dplan;
  hin.blocks = L;
  hin.micro_batches = opt.micro_batches;
  hin.clip = opt.grad_clip > 0;
  hin.separate_param = separate;
  hin.obj_bytes = pp.obj_bytes;

  std::vector<int> state_objs;  // master/param first (most traffic saved per byte), then moments
  for (int b = 0; b < L; ++b) {
    if (separate) state_objs.push_back(ObjIndex(b, Component::kParam));
    state_objs.push_back(ObjIndex(b, Component::kMaster));
  }
  for (int b = 0; b < L; ++b) {
    state_objs.push_back(ObjIndex(b, Component::kExpAvg));
    state_objs.push_back(ObjIndex(b, Component::kExpAvgSq));
  }
  uint64_t state_bytes = 0;
  for (int o : state_objs) state_bytes += pp.obj_bytes[o];

  auto cache_min_with = [&](const std::vector<bool>& cached) -> Result<uint64_t> {
    hin.cached = cached;
    return MinCacheCapacity(hin);
  };
  // The cache capacity to run with, given `room` for it: the most it can use (whole pages,
  // never more than everything it could hold at once) when the host plan works there, else
  // the smallest capacity that works. A plan's feasibility is not monotonic in the capacity
  // (first-fit placement and Belady's evictions both change with it), so a minimum that
  // works does not make every larger capacity work. nullopt when nothing within `room`
  // works.
  auto capacity_for = [&](const std::vector<bool>& cached,
                          uint64_t room) -> Result<std::optional<uint64_t>> {
    hin.cached = cached;
    uint64_t cacheable = 0;
    for (int o = 0; o < n_obj; ++o) cacheable += cached[o] ? pp.obj_bytes[o] : 0;
    hin.capacity = std::min(room, cacheable) / 4096 * 4096;
    if (PlanHost(hin).ok()) return std::optional<uint64_t>(hin.capacity);
    STRATA_ASSIGN_OR_RETURN(const uint64_t least, MinCacheCapacity(hin));
    if (least <= room) return std::optional<uint64_t>(least);
    return std::optional<uint64_t>();
  };
  std::vector<bool> cached_host = pp.cached;  // only grads in the cache
  STRATA_ASSIGN_OR_RETURN(uint64_t cache_min_host, cache_min_with(cached_host));
  const uint64_t all_host_min = state_bytes + cache_min_host + pp.staging_bytes;
  std::vector<std::string>& why = rep.reasons;

  const bool durable = opt.durable || opt.resume;
  if (opt.host_mem_bytes == 0 || opt.nvme_paths.empty()) {
    if (opt.host_mem_bytes != 0 && opt.host_mem_bytes < all_host_min) {
      return Status::OutOfMemory(
          "host budget " + FormatBytes(opt.host_mem_bytes) +
          " cannot hold the model states without NVMe: they need " + FormatBytes(state_bytes) +
          " plus " + FormatBytes(cache_min_host + pp.staging_bytes) +
          " for gradients; need at least " + FormatBytes(all_host_min) + " (" +
          std::to_string(all_host_min) + " bytes), or give NVMe paths (--nvme)");
    }
    if (durable && opt.nvme_paths.empty()) {
      return Status::InvalidArgument("durable/resume needs NVMe paths to commit the state to");
    }
    pp.cached = cached_host;
    pp.resident_bytes = state_bytes;
    uint64_t all_grads = 0;
    for (int b = 0; b < L; ++b) all_grads += pp.obj_bytes[ObjIndex(b, Component::kGrad)];
    STRATA_ASSIGN_OR_RETURN(
        const std::optional<uint64_t> capacity,
        capacity_for(cached_host, opt.host_mem_bytes
                                      ? opt.host_mem_bytes - state_bytes - pp.staging_bytes
                                      : all_grads));
    if (!capacity) return Status::Aborted("internal: the validated gradient cache does not fit");
    pp.cache_capacity = *capacity;
    rep.host_min_bytes = all_host_min;
    why.push_back("every component's home is host memory (" +
                  std::string(opt.host_mem_bytes ? "the host budget holds them all"
                                                 : "no host budget given") +
                  ")" + (durable ? "; each step also commits them to NVMe" : ""));
  } else {
    std::vector<bool> cached_all = pp.cached;
    for (int o : state_objs) cached_all[o] = true;
    STRATA_ASSIGN_OR_RETURN(uint64_t cache_min_nvme, cache_min_with(cached_all));
    const uint64_t host_min = cache_min_nvme + pp.staging_bytes;
    rep.host_min_bytes = host_min;
    if (opt.host_mem_bytes < host_min) {
      return Status::OutOfMemory(
          "host budget " + FormatBytes(opt.host_mem_bytes) +
          " is too small even with every state on NVMe: the host must stage the optimizer "
          "step of the largest block (master, exp_avg, exp_avg_sq and gradient, " +
          FormatBytes(4 * largest_f32) + ")" +
          (hin.clip || opt.micro_batches > 1
               ? " while holding every block's gradient until the update"
               : std::string()) +
          (pp.staging_bytes ? " plus " + FormatBytes(pp.staging_bytes) + " of staging" : "") +
          "; need at least " + FormatBytes(host_min) + " (" + std::to_string(host_min) + " bytes)");
    }
    // Keep a prefetch window beyond the minimum (two more optimizer steps' states, so the
    // reads of the next updates overlap the writes of the last ones), then give host
    // homes to the components that save the most NVMe traffic per byte.
    const uint64_t budget = opt.host_mem_bytes - pp.staging_bytes;
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
                              capacity_for(cached, budget - resident));
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
    why.push_back(
        "host cache " + FormatBytes(pp.cache_capacity) + " (minimum " +
        FormatBytes(cache_min_nvme) +
        ": the largest optimizer step's master, moments and gradient" +
        (hin.clip || opt.micro_batches > 1 ? ", plus every gradient held to the update" : "") +
        "); the rest of the budget holds components at home");
    for (Component c :
         {Component::kParam, Component::kMaster, Component::kExpAvg, Component::kExpAvgSq}) {
      if (!host_blocks[int(c)].empty()) {
        why.push_back(std::string(ComponentName(c)) + " of blocks " +
                      BlockList(host_blocks[int(c)]) + ": home host (" +
                      (c == Component::kExpAvg || c == Component::kExpAvgSq
                           ? "saves one NVMe read and one write per step"
                           : "saves up to three NVMe reads and one write per step") +
                      ")");
      }
      if (!nvme_blocks[int(c)].empty()) {
        why.push_back(std::string(ComponentName(c)) + " of blocks " +
                      BlockList(nvme_blocks[int(c)]) +
                      ": home NVMe (no host budget left; cached in host while in use)");
      }
    }
  }
  pp.use_nvme = pp.use_nvme || durable;
  for (int o : state_objs) {
    pp.home[o] = pp.cached[o] ? Tier::kNvme : Tier::kHost;
    if (pp.home[o] == Tier::kNvme || durable) pp.nvme_bytes += pp.obj_bytes[o];
  }
  // Objects are whole 4 KiB pages, so a partial page of cache is never used; dropping it
  // keeps the pinned pool (which rounds up to pages) inside the budget.
  pp.cache_capacity = pp.cache_capacity / 4096 * 4096;
  rep.host_resident_bytes = pp.resident_bytes;
  rep.host_cache_bytes = pp.cache_capacity + pp.staging_bytes;
  rep.nvme_bytes = pp.nvme_bytes;
  for (int b = 0; b < L; ++b) {
    for (int c = 0; c < kNumComponents; ++c) {
      const int o = ObjIndex(b, Component(c));
      if (pp.obj_bytes[o] == 0) continue;
      rep.components.push_back(ComponentPlacement{b, Component(c), pp.home[o], pp.obj_bytes[o]});
    }
  }

  // Predicted traffic: replay the steady-state plan.
  hin.cached = pp.cached;
  hin.capacity = pp.cache_capacity;
  STRATA_ASSIGN_OR_RETURN(HostPlan first, PlanHost(hin));
  hin.start_resident = first.end_resident;
  hin.start_offset = first.offset;
  auto steady_or = PlanHost(hin);
  const HostPlan& steady = steady_or.ok() ? *steady_or : first;
  int device_loads = 0, device_evictions = 0;
  for (int a = 0; a < int(schedule.size()); ++a) {
    if (dplan.steps[a].load) {
      // In device memory, each rank copies its shard and the gather fills in the rest.
      rep.predicted_bytes.h2d +=
          param_bytes[schedule[a].block] / (host_collectives ? 1 : uint64_t(opt.world_size));
      if (schedule[a].pass == Pass::kBackward) ++device_loads;
    }
    if (schedule[a].pass == Pass::kBackward)
      rep.predicted_bytes.d2h +=
          grad_bytes[schedule[a].block] / (host_collectives ? 1 : uint64_t(opt.world_size));
    for (int f : dplan.steps[a].frees) device_evictions += dplan.buffers[f].grad ? 0 : 1;
  }
  for (const HostOp& op : steady.ops) {
    if (op.kind == HostOpKind::kLoad && pp.home[op.obj] == Tier::kNvme) {
      rep.predicted_bytes.nvme_read += pp.obj_bytes[op.obj];
    }
  }
  for (int u : steady.opt_uses) {
    for (const UseObj& uo : steady.uses[u].objs) {
      if (ObjComponent(uo.obj) != Component::kGrad && pp.obj_bytes[uo.obj] &&
          (pp.home[uo.obj] == Tier::kNvme || durable)) {
        rep.predicted_bytes.nvme_write += pp.obj_bytes[uo.obj];
      }
    }
  }
  why.push_back("device: " + std::to_string(device_loads) + " of " + std::to_string(L) +
                " blocks' params copied again in backward per micro-batch set (" +
                (in.device_budget ? "budget holds " + FormatBytes(in.device_budget)
                                  : std::string("no device budget")) +
                "; evicting the block needed farthest ahead)");
  const double rd = opt.nvme_read_bps > 0 ? opt.nvme_read_bps : 2e9;
  const double wr = opt.nvme_write_bps > 0 ? opt.nvme_write_bps : 1.5e9;
  const double h2d = opt.h2d_bps > 0 ? opt.h2d_bps : 10e9;
  const double d2h = opt.d2h_bps > 0 ? opt.d2h_bps : 10e9;
  const std::pair<double, const char*> times[] = {
      {rep.predicted_bytes.nvme_read / rd, "nvme_read"},
      {rep.predicted_bytes.nvme_write / wr, "nvme_write"},
      {rep.predicted_bytes.h2d / h2d, "h2d"},
      {rep.predicted_bytes.d2h / d2h, "d2h"}};
  for (const auto& [t, name] : times) {
    if (t > rep.predicted_bound_seconds) {
      rep.predicted_bound_seconds = t;
      rep.predicted_bound_resource = name;
    }
  }
  return pp;
}

}  // namespace engine_internal
}  // namespace strata
