// Byte quantities: the one rounding helper and the one formatter every module uses, so
// a size reads the same in a placement report, an error message and a benchmark header.
//
// Header-only, stateless; safe from any thread.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace strata {

// `x` rounded up to a multiple of `alignment` (alignment >= 1).
constexpr uint64_t RoundUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// For people: "512 B", "1.5 KiB", "8.0 MiB", "1.25 GiB" (binary units; one decimal up to
// MiB, two from GiB on).
inline std::string FormatBytes(uint64_t bytes) {
  char buf[48];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / static_cast<double>(uint64_t{1} << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / static_cast<double>(uint64_t{1} << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  }
  return buf;
}

// For people and scripts: "8.0 MiB (8388608 bytes)"; the exact figure a flag can take.
inline std::string FormatBytesExact(uint64_t bytes) {
  if (bytes < 1024) return FormatBytes(bytes);
  return FormatBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace strata
