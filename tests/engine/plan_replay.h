// The planner tests' replay checks (engine/plan.h): random models and orders, and a walk of
// each plan (device, host, collectives) as its executor runs it, returning "" or what is
// wrong. Shared by plan_test.cc and plan_placement_test.cc.
//
// Random tests print their seed; STRATA_TEST_SEED=N replays one run, STRATA_TEST_TRIALS=N
// changes how many cases a run tries.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "tests/engine/random_model.h"

namespace strata::engine_internal {

inline uint64_t SeedFromEnv() {
  const char* s = std::getenv("STRATA_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
}

inline int TrialsFromEnv(int fallback) {
  const char* s = std::getenv("STRATA_TEST_TRIALS");
  return s ? std::atoi(s) : fallback;
}

using engine_test::RandomModel;

// A random order of one micro-batch: every block's forward before its backward.
inline std::vector<ScheduleEntry> RandomOrder(std::mt19937_64& rng, int blocks) {
  std::vector<ScheduleEntry> order;
  std::vector<int> fwd_left(blocks), bwd_ready;
  for (int b = 0; b < blocks; ++b) fwd_left[b] = b;
  while (!fwd_left.empty() || !bwd_ready.empty()) {
    const size_t n = fwd_left.size() + bwd_ready.size();
    const size_t k = rng() % n;
    if (k < fwd_left.size()) {
      order.push_back({fwd_left[k], Pass::kForward});
      bwd_ready.push_back(fwd_left[k]);
      fwd_left.erase(fwd_left.begin() + long(k));
    } else {
      const size_t j = k - fwd_left.size();
      order.push_back({bwd_ready[j], Pass::kBackward});
      bwd_ready.erase(bwd_ready.begin() + long(j));
    }
  }
  return order;
}

// ---------------------------------------------------------------------------------------
// Replay checks: each returns "" or what is wrong.
// ---------------------------------------------------------------------------------------

// Walks the device plan access by access as the feeder does.
inline std::string CheckDevicePlan(const std::vector<Access>& schedule,
                                   const std::vector<uint64_t>& param_bytes,
                                   const std::vector<uint64_t>& grad_bytes, uint64_t capacity,
                                   const DevicePlan& p) {
  std::ostringstream err;
  if (p.steps.size() != schedule.size()) return "one step per access expected";
  std::set<int> resident, ever;
  uint64_t used = 0, peak = 0;
  for (size_t a = 0; a < schedule.size(); ++a) {
    const Access& acc = schedule[a];
    const DevStep& st = p.steps[a];
    for (int f : st.frees) {
      if (!resident.count(f)) return "access " + std::to_string(a) + " frees a buffer not held";
      if (f == st.param_buffer) return "access " + std::to_string(a) + " frees its own params";
      resident.erase(f);
      used -= p.buffers[f].bytes;
    }
    if (st.param_buffer < 0 || st.param_buffer >= int(p.buffers.size())) return "no param buffer";
    const DevBuffer& pb = p.buffers[st.param_buffer];
    if (pb.grad || pb.block != acc.block) return "param buffer of another block or a gradient";
    if (st.load) {
      if (ever.count(st.param_buffer)) return "a param buffer loaded twice";
      if (pb.bytes != RoundUp(param_bytes[acc.block], 256)) return "param buffer size";
      resident.insert(st.param_buffer);
      ever.insert(st.param_buffer);
      used += pb.bytes;
    } else if (!resident.count(st.param_buffer)) {
      return "access " + std::to_string(a) + " uses params that are not resident";
    }
    if ((acc.pass == Pass::kBackward) != (st.grad_buffer >= 0)) return "gradient buffer";
    if (st.grad_buffer >= 0) {
      const DevBuffer& gb = p.buffers[st.grad_buffer];
      if (!gb.grad || gb.block != acc.block || ever.count(st.grad_buffer)) return "grad buffer";
      if (gb.bytes != RoundUp(grad_bytes[acc.block], 256)) return "grad buffer size";
      resident.insert(st.grad_buffer);
      ever.insert(st.grad_buffer);
      used += gb.bytes;
    }
    peak = std::max(peak, used);
    if (capacity && used > capacity) {
      err << "access " << a << " holds " << used << " bytes over the capacity " << capacity;
      return err.str();
    }
  }
  if (std::set<int>(p.end_frees.begin(), p.end_frees.end()) != resident) return "end_frees";
  if (peak != p.peak_bytes) return "peak_bytes is not the replayed peak";
  return "";
}

// An eviction of object `o` after `kb` of its `n` uses, when `o` is a gradient: it must stay
// from its first landing to its update (across the step boundary when deferred), unless it
// is spilled to NVMe from its final landing on. "" when the eviction is allowed.
inline std::string CheckGradEviction(const HostPlanInput& in, const HostPlan& p, int o, int kb,
                                     int n) {
  if (ObjComponent(o) != Component::kGrad) return "";
  // The gradient's uses: the last step's carried update (if any), this step's landings,
  // and its own update unless deferred to the next step. A spilled gradient is on NVMe
  // from its final landing on; one that is not must stay from its first landing to its
  // update, across the step boundary when deferred.
  const int b = ObjBlock(o);
  const int c = std::count(in.carried.begin(), in.carried.end(), b) ? 1 : 0;
  const bool deferred = std::count(p.deferred.begin(), p.deferred.end(), b) > 0;
  const int final_landing = n - (deferred ? 0 : 1);  // uses done at the final landing
  if (c && kb == 0 && !in.spill_grads) return "a carried gradient evicted before its update";
  if (kb > c && kb < final_landing) {
    return "a gradient evicted between its landing and its update";
  }
  if (kb == final_landing && kb > c && !in.spill_grads) {
    return "a gradient evicted between its landing and its update";
  }
  return "";
}

// The host plan's optimizer steps against their rules (CheckHostPlan's last part).
inline std::string CheckHostPlanUpdates(const HostPlanInput& in, const HostPlan& p) {
  const int n_use = int(p.uses.size());
  const std::set<int> held(p.held.begin(), p.held.end());
  // Optimizer steps: one per block, after every gradient of the block (after all of them
  // with clipping, which needs the global norm first), or none for a block whose update is
  // deferred to the next step. The last step's carried updates come first: each before any
  // other use of its block, all of them before the step's own updates, in the carried order.
  std::vector<int> opt_at(in.blocks, -1), last_grad(in.blocks, -1), first_use(in.blocks, -1);
  std::vector<int> carried_seen;
  int last_any_grad = -1;
  for (int u = 0; u < n_use; ++u) {
    const HostUse& hu = p.uses[u];
    if (hu.kind == UseKind::kOpt && hu.carried) {
      if (first_use[hu.block] >= 0) return "a carried update after a use of its block";
      if (opt_at[hu.block] >= 0) return "a carried update after the step's own update";
      carried_seen.push_back(hu.block);
      first_use[hu.block] = u;
      continue;
    }
    if (first_use[hu.block] < 0) first_use[hu.block] = u;
    if (hu.kind == UseKind::kGradIn) last_grad[hu.block] = u, last_any_grad = u;
    if (hu.kind == UseKind::kOpt) {
      if (opt_at[hu.block] >= 0) return "two optimizer steps of one block";
      if (carried_seen.size() != in.carried.size()) return "an own update before a carried one";
      opt_at[hu.block] = u;
    }
  }
  if (carried_seen != in.carried) return "carried updates missing or out of order";
  const std::set<int> deferred(p.deferred.begin(), p.deferred.end());
  for (int b = 0; b < in.blocks; ++b) {
    if (deferred.count(b)) {
      if (opt_at[b] >= 0) return "a deferred update also in its step";
      if (!in.pipelined || !in.clip) return "an update deferred without pipelining";
      if (!in.spill_grads && !std::count(p.end_resident.begin(), p.end_resident.end(),
                                         ObjIndex(b, Component::kGrad))) {
        return "a deferred update's gradient does not stay";
      }
      continue;
    }
    if (opt_at[b] < last_grad[b]) return "an update before its gradients";
    const bool speculates = in.speculative && b < int(in.restorable.size()) && in.restorable[b];
    if (in.clip && !speculates && opt_at[b] < last_any_grad) {
      return "an update before the global norm";
    }
    // A speculative update's gradient stays until the end of the step (or is on NVMe).
    if (in.clip && speculates && !in.spill_grads && !held.count(ObjIndex(b, Component::kGrad))) {
      return "a speculative update's gradient is not held";
    }
  }
  return "";
}

// Walks the host plan's operations in order as the host executor does, with the uses
// running as soon as what they wait for is done: the cache never exceeds its capacity,
// placed objects never overlap, every use finds its objects resident, every eviction waits
// only for uses whose loads come before it (no deadlock), gradients stay from their first
// landing to their update.
inline std::string CheckHostPlan(const HostPlanInput& in, const HostPlan& p) {
  std::ostringstream err;
  const int n_obj = in.blocks * kNumComponents;
  const int n_use = int(p.uses.size());
  // Per object: the use index of each of its uses, in seq order.
  std::vector<std::vector<int>> uses_of(n_obj);
  for (int u = 0; u < n_use; ++u) {
    for (const UseObj& uo : p.uses[u].objs) {
      if (uo.seq != int(uses_of[uo.obj].size())) return "use seq out of order";
      uses_of[uo.obj].push_back(u);
    }
  }
  // Residency intervals: per object, the seqs each residency served, [from, to).
  std::vector<int> from(n_obj, -1);
  std::vector<bool> loaded(n_obj, false);  // resident by a load of this plan (not carried over)
  std::vector<uint64_t> off_of(n_obj, 0);
  std::vector<std::vector<std::pair<int, int>>> served(n_obj);
  std::map<uint64_t, std::pair<uint64_t, int>> placed;  // offset -> (end, obj)
  uint64_t used = 0, peak = 0;
  auto place = [&](int obj, uint64_t off) -> std::string {
    const uint64_t end = off + in.obj_bytes[obj];
    if (end > in.capacity) return "object placed past the capacity";
    auto it = placed.lower_bound(off);
    if (it != placed.end() && it->first < end) return "placed objects overlap";
    if (it != placed.begin() && std::prev(it)->second.first > off) return "placed objects overlap";
    placed[off] = {end, obj};
    off_of[obj] = off;
    used += in.obj_bytes[obj];
    peak = std::max(peak, used);
    return "";
  };
  for (int o : in.start_resident) {
    if (std::string e = place(o, in.start_offset[o]); !e.empty()) return "start: " + e;
    from[o] = 0;
  }
  std::vector<size_t> next_load(p.ops.size() + 1, p.ops.size());
  for (size_t k = p.ops.size(); k-- > 0;) {
    next_load[k] = p.ops[k].kind == HostOpKind::kEvict ? next_load[k + 1] : k;
  }
  int last_load_use = -1;
  for (size_t k = 0; k < p.ops.size(); ++k) {
    const HostOp& op = p.ops[k];
    const int o = op.obj;
    if (!in.cached[o]) return "an operation on an object that is not cached";
    if (op.kind == HostOpKind::kEvict) {
      if (from[o] < 0) return "op " + std::to_string(k) + " evicts an object not resident";
      const int kb = op.uses_before;
      if (kb < from[o] || kb > int(uses_of[o].size())) return "eviction's uses_before";
      if (kb == from[o] && loaded[o]) return "an object loaded and evicted unused";
      // The eviction waits for use uses_of[o][kb-1]; that use must not wait for a load that
      // comes after this eviction.
      const int next_use =
          next_load[k] < p.ops.size() ? p.ops[next_load[k]].use : std::numeric_limits<int>::max();
      if (kb > 0 && uses_of[o][kb - 1] >= next_use) {
        return "op " + std::to_string(k) + " evicts for a use that waits for a later load";
      }
      if (std::string e = CheckGradEviction(in, p, o, kb, int(uses_of[o].size())); !e.empty()) {
        return e;
      }
      served[o].push_back({from[o], kb});
      from[o] = -1;
      placed.erase(off_of[o]);
      used -= in.obj_bytes[o];
      continue;
    }
    if (op.use < last_load_use) return "loads out of use order";
    last_load_use = op.use;
    if (from[o] >= 0) return "op " + std::to_string(k) + " loads an object already resident";
    const HostUse& u = p.uses[op.use];
    auto uo =
        std::find_if(u.objs.begin(), u.objs.end(), [&](const UseObj& x) { return x.obj == o; });
    if (uo == u.objs.end()) return "a load for a use that does not use the object";
    if ((op.kind == HostOpKind::kAlloc) != uo->produce) return "alloc vs load mismatch";
    if (std::string e = place(o, op.offset); !e.empty())
      return "op " + std::to_string(k) + ": " + e;
    from[o] = uo->seq;
    loaded[o] = true;
    if (used > in.capacity) return "cache over capacity";
  }
  std::set<int> end_resident;
  const std::set<int> held(p.held.begin(), p.held.end());
  for (int o = 0; o < n_obj; ++o) {
    if (held.count(o) && from[o] < 0) return "a held gradient was evicted";
    if (from[o] >= 0) {
      served[o].push_back({from[o], int(uses_of[o].size())});
      if (!held.count(o)) end_resident.insert(o);
      if (p.offset[o] != off_of[o]) return "offset of an end resident";
    }
    if (!in.cached[o]) continue;
    // Every use of a cached object is served by exactly one residency.
    std::vector<int> cover(uses_of[o].size(), 0);
    for (auto [a, b] : served[o]) {
      for (int s = a; s < b; ++s) ++cover[s];
    }
    for (size_t s = 0; s < cover.size(); ++s) {
      if (cover[s] != 1) {
        err << "use " << s << " of object " << o << " is served " << cover[s] << " times";
        return err.str();
      }
    }
  }
  if (std::set<int>(p.end_resident.begin(), p.end_resident.end()) != end_resident) {
    return "end_resident";
  }
  if (peak > in.capacity) return "peak over capacity";
  return CheckHostPlanUpdates(in, p);
}

// The order of collectives against its rules (see PlanCommSequence).
inline std::string CheckCommSequence(const std::vector<Access>& schedule, const DevicePlan& device,
                                     const HostPlan& host, const CommSequenceOptions& options,
                                     const std::vector<CommItem>& seq) {
  // The access whose gradient buffer each buffer is (-1: params).
  std::vector<int> grad_access(device.buffers.size(), -1);
  for (int a = 0; a < int(schedule.size()); ++a) {
    if (device.steps[a].grad_buffer >= 0) grad_access[device.steps[a].grad_buffer] = a;
  }
  std::vector<int> loads, backwards;
  for (int a = 0; a < int(schedule.size()); ++a) {
    if (device.steps[a].load) loads.push_back(a);
    if (schedule[a].pass == Pass::kBackward) backwards.push_back(a);
  }
  std::vector<int> gathered, reduced;
  int slot = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    const CommItem& c = seq[i];
    if (c.kind == CommItem::kNorm) {
      if (i + 1 != seq.size()) return "the norm is not last";
      continue;
    }
    if (c.kind == CommItem::kGather) {
      if (c.slot != slot) return "gather buffers do not alternate";
      slot ^= 1;
      gathered.push_back(c.access);
      continue;
    }
    // A reduce-scatter waits for its backward compute, which waits for every gather of a
    // load at or before it.
    for (int x : loads) {
      if (x <= c.access && std::find(gathered.begin(), gathered.end(), x) == gathered.end()) {
        return "reduce-scatter of access " + std::to_string(c.access) +
               " comes before the gather of access " + std::to_string(x);
      }
    }
    // A gather moved ahead of this reduce-scatter must not need its gradient use or later:
    // its shard's previous uses and its load's evictions all come before.
    for (size_t k = 0; k < gathered.size(); ++k) {
      const int x = gathered[k];
      if (x <= c.access) continue;
      const int u = host.h2d_use[x];
      for (const UseObj& uo : host.uses[u].objs) {
        for (int v = 0; v < u; ++v) {
          for (const UseObj& w : host.uses[v].objs) {
            if (w.obj == uo.obj && w.seq == uo.seq - 1 && v >= host.grad_use[c.access]) {
              return "a gather moved ahead of the reduce-scatter it waits for";
            }
          }
        }
      }
      // In host memory the gather waits for its gather buffer, freed by the H2D copy of the
      // gather before the last one (access gathered[k - 2]): the feeder's on its way there
      // frees gradient buffers, each after its D2H copy, which the D2H lane runs after the
      // waits for the reduce-scatters of the gradients landed before it.
      if (!options.device_collectives) {
        if (k < 2) continue;
        for (int y = 0; y <= gathered[k - 2]; ++y) {
          for (int f : device.steps[y].frees) {
            if (grad_access[f] > c.access) {
              return "a gather moved ahead of a reduce-scatter that the D2H copy of a gradient "
                     "buffer the feeder frees before its gather buffer is free waits for";
            }
          }
        }
        continue;
      }
      // In device memory the gather also waits for the feeder's copy of access x, and the
      // feeder frees a gradient buffer only after that gradient's reduce-scatter.
      for (int y = 0; y <= x; ++y) {
        for (int f : device.steps[y].frees) {
          if (grad_access[f] >= c.access) {
            return "a gather moved ahead of a reduce-scatter whose buffer the feeder frees first";
          }
        }
      }
    }
    reduced.push_back(c.access);
  }
  if (seq.empty() || seq.back().kind != CommItem::kNorm) return "no norm at the end";
  if (gathered != loads) return "gathers are not one per load in access order";
  if (reduced != backwards) return "reduce-scatters are not one per backward in access order";
  return "";
}

// A random model and planner options: what the placement and collective-order tests draw.
struct RandomCase {
  std::vector<BlockLayout> layout;
  PlanOptions options;
  std::string text;
};

inline RandomCase MakeRandomCase(std::mt19937_64& rng) {
  RandomCase c;
  const int L = 1 + int(rng() % 6);
  const int world = rng() % 3 == 0 ? 2 + int(rng() % 3) : 1;
  const uint32_t align = std::vector<uint32_t>{1, 4, 64}[rng() % 3];
  auto layout = ComputeLayout(RandomModel(rng, L), align, world);
  c.layout = *layout;
  PlanOptions& o = c.options;
  o.micro_batches = 1 + int(rng() % 3);
  o.clip = rng() % 2;
  o.dtype = rng() % 2 ? WorkingDtype::kFp32 : WorkingDtype::kBf16;
  o.world_size = world;
  o.rank = int(rng() % uint64_t(world));
  if (world > 1) o.collectives = rng() % 2 ? CollectiveMemory::kDevice : CollectiveMemory::kHost;
  o.nvme = rng() % 4 != 0;
  o.durable = o.nvme && rng() % 3 == 0;
  o.speculation = Speculation(rng() % 3);
  o.grad_spill = GradSpill(rng() % 3);
  o.pipeline = rng() % 2;
  if (rng() % 2) o.schedule = RandomOrder(rng, L);
  if (rng() % 3 == 0) o.micro_batch_order = MicroBatchOrder::kLayerMajor;
  std::ostringstream t;
  t << "L=" << L << " world=" << world << " align=" << align << " micro=" << o.micro_batches
    << " clip=" << o.clip << " dtype=" << WorkingDtypeName(o.dtype)
    << " collectives=" << CollectiveMemoryName(o.collectives) << " nvme=" << o.nvme
    << " durable=" << o.durable << " speculation=" << SpeculationName(o.speculation)
    << " spill=" << GradSpillName(o.grad_spill) << " pipeline=" << o.pipeline
    << " schedule=" << (o.schedule.empty() ? "standard" : "random")
    << " order=" << MicroBatchOrderName(o.micro_batch_order);
  c.text = t.str();
  return c;
}

// Plans at these budgets as the engine does (placement, device plan, three steps of host
// plans carrying the cache over, the collectives) and checks every plan by replay.

}  // namespace strata::engine_internal
