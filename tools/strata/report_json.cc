// The JSON shapes train and bench step share; see report_json.h.
#include "tools/strata/report_json.h"

namespace strata::cli {

nlohmann::json StepStatsJson(const StepStats& st) {
  nlohmann::json busy;
  for (int r = 0; r < kNumResources; ++r) busy[ResourceName(Resource(r))] = st.busy_seconds[r];
  return {{"step", st.step},
          {"seconds", st.seconds},
          {"bound_seconds", st.bound_seconds},
          {"bound_resource", st.bound_resource},
          {"efficiency", st.efficiency},
          {"stall_seconds", st.stall_seconds},
          {"tail_seconds", st.tail_seconds},
          {"redone_blocks", st.redone_blocks},
          {"redo_seconds", st.redo_seconds},
          {"speculative", st.speculative},
          {"deferred_blocks", st.deferred_blocks},
          {"overlapped_seconds", st.overlapped_seconds},
          {"nvme_busy_seconds", st.nvme_busy_seconds},
          {"grad_norm", st.grad_norm},
          {"skipped", st.skipped},
          {"peak_device_bytes", st.peak_device_bytes},
          {"peak_host_bytes", st.peak_host_bytes},
          {"busy_seconds", busy},
          {"bytes",
           {{"nvme_read", st.bytes.nvme_read},
            {"nvme_write", st.bytes.nvme_write},
            {"h2d", st.bytes.h2d},
            {"d2h", st.bytes.d2h},
            {"comm", st.bytes.comm}}},
          {"activation_bytes",
           {{"nvme_read", st.activation_bytes.nvme_read},
            {"nvme_write", st.activation_bytes.nvme_write},
            {"h2d", st.activation_bytes.h2d},
            {"d2h", st.activation_bytes.d2h}}},
          {"activation_fetch_waits", st.activation_fetch_waits}};
}

nlohmann::json PlacementJson(const PlacementReport& place) {
  nlohmann::json comps = nlohmann::json::array();
  for (const ComponentPlacement& c : place.components) {
    comps.push_back({{"block", c.block},
                     {"component", ComponentName(c.component)},
                     {"home", TierName(c.home)},
                     {"bytes", c.bytes}});
  }
  return {{"components", comps},
          {"reasons", place.reasons},
          {"nvme_bytes", place.nvme_bytes},
          {"nvme_file_bytes", place.nvme_file_bytes},
          {"device_min_bytes", place.device_min_bytes},
          {"host_min_bytes", place.host_min_bytes},
          {"activation_slot_bytes", place.activation_slot_bytes},
          {"activation_count", place.activation_count},
          {"activation_host_slots", place.activation_host_slots},
          {"activation_host_bytes", place.activation_host_bytes},
          {"activation_nvme_bytes", place.activation_nvme_bytes},
          {"activation_host_capacity", place.activation_host_capacity},
          {"activation_nvme_capacity", place.activation_nvme_capacity},
          {"predicted_bytes",
           {{"nvme_read", place.predicted_bytes.nvme_read},
            {"nvme_write", place.predicted_bytes.nvme_write},
            {"h2d", place.predicted_bytes.h2d},
            {"d2h", place.predicted_bytes.d2h},
            {"comm", place.predicted_bytes.comm}}}};
}

}  // namespace strata::cli
