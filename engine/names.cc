// Names of the public enums (strata/engine.h) and the placement report's text.
#include <cstdio>
#include <sstream>

#include "strata/bytes.h"
#include "strata/engine.h"

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

const char* MicroBatchOrderName(MicroBatchOrder order) {
  return order == MicroBatchOrder::kLayerMajor ? "layer" : "batch";
}

const char* SpeculationName(Speculation s) {
  return s == Speculation::kOn ? "on" : s == Speculation::kOff ? "off" : "auto";
}

const char* GradDtypeName(GradDtype d) { return d == GradDtype::kBf16 ? "bf16" : "fp32"; }

const char* GradSpillName(GradSpill s) {
  return s == GradSpill::kOn ? "on" : s == GradSpill::kOff ? "off" : "auto";
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
  os << "# placement: working dtype " << WorkingDtypeName(dtype) << ", Adam moments "
     << StateFormatName(state_format) << ", master " << MasterFormatName(master_format) << "\n";
  os << "#   device budget " << (device_budget_bytes ? FormatBytes(device_budget_bytes) : "none")
     << " (minimum " << FormatBytes(device_min_bytes) << ")\n";
  os << "#   host budget " << (host_budget_bytes ? FormatBytes(host_budget_bytes) : "unlimited")
     << " (minimum " << FormatBytes(host_min_bytes) << "): homes "
     << FormatBytes(host_resident_bytes) << ", cache/staging " << FormatBytes(host_cache_bytes)
     << "\n";
  os << "#   nvme " << FormatBytes(nvme_bytes);
  if (nvme_file_bytes > 0) {
    // Why the files are larger than the states: see PlacementReport::nvme_file_bytes.
    os << " of states; swap files " << FormatBytes(nvme_file_bytes) << " on disk (a committed"
       << " and a pending version of each extent, " << FormatBytes(2 * nvme_bytes)
       << ", plus room for fragmentation, in whole " << FormatBytes(nvme_stripe_bytes)
       << " stripes over " << nvme_folders << (nvme_folders == 1 ? " folder" : " folders") << ")";
  }
  os << "\n";
  if (activation_count > 0) {
    os << "#   activations " << activation_count << " slots of "
       << FormatBytes(activation_slot_bytes) << ": " << activation_host_slots << " in host memory ("
       << FormatBytes(activation_host_bytes) << "), scratch files "
       << FormatBytes(activation_nvme_bytes) << " on NVMe; the budgets admit "
       << (activation_host_capacity < 0
               ? std::string("any number") + " in host memory (no host budget)"
               : std::to_string(activation_host_capacity) + " in host memory, " +
                     std::to_string(activation_nvme_capacity) + " on NVMe")
       << "\n";
  }
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

}  // namespace strata
