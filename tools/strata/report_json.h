// The JSON shapes that `strata train --json` and `strata bench step --json` share: one step's
// engine statistics and the engine's placement, so a script reads both the same way.
// Internal to the CLI.
#pragma once

#include <nlohmann/json.hpp>

#include "strata/engine.h"

namespace strata::cli {

// step, seconds, bound_seconds, bound_resource, efficiency, stall_seconds, tail_seconds,
// redone_blocks, deferred_blocks, overlapped_seconds, nvme_busy_seconds, grad_norm,
// peak_device_bytes, peak_host_bytes, busy_seconds{resource}, bytes{nvme_read, nvme_write, h2d,
// d2h, comm}, activation_bytes{nvme_read, nvme_write, h2d, d2h} (the activation stash's part of
// bytes), activation_fetch_waits.
nlohmann::json StepStatsJson(const StepStats& st);

// components[{block, component, home, bytes}], reasons, nvme_bytes (the states),
// nvme_file_bytes (the swap files on disk), device_min_bytes, host_min_bytes,
// activation_slot_bytes, activation_count, activation_host_slots, activation_host_bytes,
// activation_nvme_bytes.
nlohmann::json PlacementJson(const PlacementReport& place);

}  // namespace strata::cli
