// The activation stash's share of the host budget (docs/design.md "Activations").
//
// The states are planned as without activations, with the host budget less a reserve for
// the stash: its minimum (kMinActivationHostSlots slots: a landing, a fetch staging, a
// prefetch) when NVMe can take the rest, else every activation (without NVMe they all stay
// in host memory). The stash then gets whatever the states leave of the budget, in whole
// slots, and the activations beyond those slots live in scratch files on NVMe. Planning the
// states within `budget - reserve` keeps the minimum a threshold (plan.h): the states plan
// at every budget at or above their own minimum, and the reserve is always left.
#include <algorithm>
#include <optional>
#include <string>

#include "engine/plan.h"

namespace strata::engine_internal {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t Footprint(const PlacementPlan& pp) {
  return pp.resident_bytes + pp.cache_capacity + pp.staging_bytes;
}

// The least host budget of the states alone under `opt` (its own budget aside), or nullopt
// when they do not plan (a short device budget: then the states' own error says so).
std::optional<uint64_t> StatesMinimum(const std::vector<BlockLayout>& layout, PlanOptions opt) {
  // A huge budget, not an unlimited one: with NVMe the unlimited report is the all-on-host
  // minimum.
  opt.host_budget = 1ull << 60;
  auto roomy = PlanStates(layout, opt);
  return roomy.ok() ? std::optional<uint64_t>(roomy->report.host_min_bytes) : std::nullopt;
}

}  // namespace

Result<PlacementPlan> PlanPlacement(const std::vector<BlockLayout>& layout,
                                    const PlanOptions& opt) {
  if (opt.activation_bytes == 0 || opt.activation_count <= 0) return PlanStates(layout, opt);
  const uint64_t slot = RoundUp(opt.activation_bytes, kPage);
  const int count = opt.activation_count;
  const int min_slots = std::min(count, kMinActivationHostSlots);
  const uint64_t reserve = uint64_t(opt.nvme ? min_slots : count) * slot;
  const std::string what = std::to_string(count) + " activations of " +
                           FormatBytes(opt.activation_bytes) + " (slots of " + FormatBytes(slot) +
                           ")";
  PlanOptions states = opt;
  if (opt.host_budget)
    states.host_budget = opt.host_budget > reserve ? opt.host_budget - reserve : 0;
  Result<PlacementPlan> planned = Status::OutOfMemory("no host budget left for the states");
  if (!opt.host_budget || states.host_budget) planned = PlanStates(layout, states);
  if (!planned.ok()) {
    if (planned.status().code() != StatusCode::kOutOfMemory || !opt.host_budget) {
      return planned.status();
    }
    const std::optional<uint64_t> states_min = StatesMinimum(layout, opt);
    if (!states_min) return planned.status();
    const uint64_t need = *states_min + reserve;
    std::string msg = "host budget " + FormatBytes(opt.host_budget) +
                      " cannot hold the model states and the activation stash of " + what +
                      ": the states need at least " + FormatBytes(*states_min) + " and the stash ";
    if (opt.nvme) {
      msg += "at least " + FormatBytes(reserve) + " (" + std::to_string(min_slots) +
             " slots: a landing, a fetch staging and a prefetch; the other activations go to "
             "NVMe)";
    } else {
      msg += FormatBytes(reserve) + " (without NVMe every activation stays in host memory)";
    }
    msg += "; need at least " + FormatBytesExact(need) + " of --host-mem";
    if (!opt.nvme) {
      PlanOptions with_nvme = opt;
      with_nvme.nvme = true;
      with_nvme.nvme_folders = 1;
      const std::optional<uint64_t> nvme_min = StatesMinimum(layout, with_nvme);
      if (nvme_min) {
        msg += "; or --nvme DIR (the activations beyond " + std::to_string(min_slots) +
               " host slots, and states, on NVMe): " +
               FormatBytes(*nvme_min + uint64_t(min_slots) * slot);
      }
    }
    return Status::OutOfMemory(msg);
  }
  PlacementPlan pp = std::move(planned).value();
  PlacementReport& rep = pp.report;
  const int host_slots =
      opt.host_budget ? int(std::min<uint64_t>(count, (opt.host_budget - Footprint(pp)) / slot))
                      : count;
  rep.host_min_bytes += reserve;
  rep.activation_slot_bytes = slot;
  rep.activation_count = count;
  rep.activation_host_slots = host_slots;
  rep.activation_host_bytes = uint64_t(host_slots) * slot;
  rep.activation_host_capacity = -1;
  if (opt.host_budget && opt.nvme) {
    // The slots the states leave (the states' plan is the same for every count >= the reserve).
    rep.activation_host_capacity = int64_t((opt.host_budget - Footprint(pp)) / slot);
  } else if (opt.host_budget) {
    // Every activation in host memory: the states planned within what they leave shrink to
    // their minimum, which the budget holds for every count up to this (plan.h's threshold).
    const std::optional<uint64_t> states_min = StatesMinimum(layout, opt);
    if (states_min && *states_min <= opt.host_budget) {
      rep.activation_host_capacity = int64_t((opt.host_budget - *states_min) / slot);
    } else {
      rep.activation_host_capacity = count;
    }
  }
  if (host_slots < count) {
    // One slot per activation over the folders (a key keeps its NVMe slot while live).
    const uint64_t folders = uint64_t(std::max(opt.nvme_folders, 1));
    rep.activation_nvme_bytes = (uint64_t(count) + folders - 1) / folders * slot * folders;
    rep.reasons.push_back("activations: " + std::to_string(host_slots) + " of " + what +
                          " in pinned host memory (the host budget the states leave; at least " +
                          std::to_string(min_slots) +
                          "), the others spilled to scratch files on NVMe (" +
                          FormatBytes(rep.activation_nvme_bytes) +
                          ", checksummed, never committed) and prefetched in the order the "
                          "first step fetched them");
  } else {
    rep.reasons.push_back("activations: all " + what + " in pinned host memory");
  }
  return pp;
}

}  // namespace strata::engine_internal
