// Fuzz target: the swap store's manifest decoder. The input is decoded as given (nearly all
// mutations then fail the trailing checksum), and again with the checksum recomputed, so the
// fields behind it are reached too. Any input must give a Status, never a crash or an
// exception; an accepted manifest must describe extents inside its capacity and re-encode to
// the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/manifest.h"

namespace {

void DecodeAndCheck(const std::string& bytes) {
  namespace si = strata::swap_internal;
  auto m = si::DecodeManifest(bytes, "fuzz/strata.manifest");
  if (!m.ok()) return;
  for (const si::ManifestEntry& e : m->entries) {
    if (e.offset % 4096 != 0 || e.length > m->capacity_bytes ||
        e.offset > m->capacity_bytes - e.length) {
      std::fprintf(stderr, "accepted extent '%s' outside the capacity\n", e.key.c_str());
      std::abort();
    }
  }
  if (si::EncodeManifest(*m) != bytes) {
    std::fprintf(stderr, "accepted bytes that do not re-encode to themselves\n");
    std::abort();  // the format has one encoding: anything else was ignored on reading
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  DecodeAndCheck(bytes);
  if (bytes.size() >= 16) {
    const uint64_t sum = strata::swap_internal::Checksum64(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    DecodeAndCheck(bytes);
  }
  return 0;
}
