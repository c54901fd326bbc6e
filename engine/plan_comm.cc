// The order of the step's collectives (see PlanCommSequence in plan.h).
#include <algorithm>
#include <unordered_map>

#include "engine/plan.h"

namespace strata::engine_internal {

// The order of collectives must be the same on every rank and must never make the comm
// thread wait for something that itself waits for a later collective. The host plan (the
// same on every rank: a deterministic function of the same inputs) orders its uses h2d(a),
// [optimizer steps], grad(a), h2d(a+1), ...; issuing each all-gather at its h2d use and
// each reduce-scatter at its grad use is safe, since everything a use waits for (earlier
// uses, and the evictions before its load) comes before it. To overlap the next block's
// gather with the current block's compute, the all-gather of the next load is moved ahead
// of the current reduce-scatter when the plan shows that its shard becomes ready without
// waiting for that reduce-scatter or anything after it, and the host budget cannot make
// it wait (unlimited, or a plan without evictions; see below). In device memory a gather
// also waits for the feeder's H2D copy of the shard, and the feeder frees gradient buffers
// only once their shard's D2H copy is enqueued, after their reduce-scatter: so the gather
// may not move ahead of the reduce-scatter of a gradient buffer that the feeder frees on
// its way to that load. In host memory a gather waits for its gather buffer, which the H2D
// copy of the gather before the last one frees: the feeder must have reached that load,
// freeing the gradient buffers before it, and a gradient buffer is freed after its D2H
// copy, which the D2H lane runs after the waits for the reduce-scatters of the gradients
// landed before it. So the gather may not move ahead of the reduce-scatter of an access
// before a gradient buffer that the feeder frees on its way to that earlier load (seed
// 1138143941 of EngineMultirankTest: both ranks waited on that cycle).
std::vector<CommItem> PlanCommSequence(const std::vector<Access>& schedule,
                                       const DevicePlan& device, const HostPlan& p,
                                       const CommSequenceOptions& options) {
  std::vector<CommItem> seq;
  // Global index of the seq-th use of each object.
  std::unordered_map<int64_t, int> use_of;
  for (int u = 0; u < int(p.uses.size()); ++u) {
    for (const UseObj& uo : p.uses[u].objs) use_of[int64_t(uo.obj) * 1000003 + uo.seq] = u;
  }
  auto use_index = [&](int obj, int seq) {
    auto it = use_of.find(int64_t(obj) * 1000003 + seq);
    return it == use_of.end() ? -1 : it->second;
  };
  // The latest use that any host op up to each op waits for.
  std::vector<int> waits(p.ops.size(), -1);
  std::unordered_map<int, size_t> load_op;  // use -> its load/alloc op
  int latest = -1;
  for (size_t k = 0; k < p.ops.size(); ++k) {
    const HostOp& op = p.ops[k];
    if (op.kind == HostOpKind::kEvict && op.uses_before > 0) {
      latest = std::max(latest, use_index(op.obj, op.uses_before - 1));
    }
    if (op.kind != HostOpKind::kEvict && op.use >= 0) load_op[op.use] = k;
    waits[k] = latest;
  }
  // The latest use the shard of use `u` waits for before it is ready.
  auto ready_after = [&](int u) {
    int w = -1;
    for (const UseObj& uo : p.uses[u].objs) {
      if (uo.seq > 0) w = std::max(w, use_index(uo.obj, uo.seq - 1));
    }
    auto it = load_op.find(u);
    if (it != load_op.end()) w = std::max(w, waits[it->second]);
    return w;
  };
  std::vector<int> loads;
  for (int a = 0; a < int(schedule.size()); ++a) {
    if (p.h2d_use[a] >= 0) loads.push_back(a);
  }
  // Reordering is only used where no eviction can make a shard wait: a host plan that never
  // evicts, or an unlimited host budget (every state at home, the cache has room for every
  // gradient, so params never wait for cache space). Randomised tests at minimum budgets
  // found plans where an eviction chain made the early gather wait for the reduce-scatter
  // it was moved ahead of.
  bool lookahead = options.host_budget_unlimited;
  if (!lookahead) {
    lookahead = true;
    for (const HostOp& op : p.ops) lookahead = lookahead && op.kind != HostOpKind::kEvict;
  }
  // The latest access whose gradient buffer the feeder frees up to each access (-1: none).
  std::vector<int> freed_grad_upto(schedule.size(), -1);
  {
    std::vector<int> grad_access(device.buffers.size(), -1);
    for (int a = 0; a < int(schedule.size()); ++a) {
      if (device.steps[a].grad_buffer >= 0) grad_access[device.steps[a].grad_buffer] = a;
    }
    int latest_freed = -1;
    for (int a = 0; a < int(schedule.size()); ++a) {
      for (int f : device.steps[a].frees) latest_freed = std::max(latest_freed, grad_access[f]);
      freed_grad_upto[a] = latest_freed;
    }
  }
  size_t next = 0;
  int gathers = 0;
  for (int a = 0; a < int(schedule.size()); ++a) {
    while (next < loads.size() && loads[next] <= a) {
      seq.push_back(CommItem{CommItem::kGather, loads[next++], gathers++ % 2});
    }
    if (schedule[a].pass != Pass::kBackward) continue;
    // What the feeder must have freed before the gather may be issued: in device memory, on
    // its way to this load (freed after their reduce-scatters); in host memory, on its way
    // to the load whose gather buffer this one reuses (freed after the reduce-scatters of
    // the gradients landed before them).
    const bool feeder_ok =
        next < loads.size() &&
        (options.device_collectives ? freed_grad_upto[loads[next]] < a
                                    : next < 2 || freed_grad_upto[loads[next - 2]] <= a);
    if (lookahead && feeder_ok && ready_after(p.h2d_use[loads[next]]) < p.grad_use[a]) {
      seq.push_back(CommItem{CommItem::kGather, loads[next++], gathers++ % 2});
    }
    seq.push_back(CommItem{CommItem::kReduce, a, 0});
  }
  while (next < loads.size()) {
    seq.push_back(CommItem{CommItem::kGather, loads[next++], gathers++ % 2});
  }
  seq.push_back(CommItem{CommItem::kNorm, 0, 0});
  return seq;
}

}  // namespace strata::engine_internal
