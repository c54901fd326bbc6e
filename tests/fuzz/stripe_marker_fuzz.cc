// Fuzz target: the swap store's stripe marker decoder (io/stripe_marker.h), the file in every
// folder of a store that a fresh run and a resume trust to tell which store the folder holds.
// The input is decoded as given (nearly all mutations then fail the seal), and again with the
// seal recomputed, so the fields behind it are reached too. Any input must give a Status,
// never a crash or an exception; an accepted marker must be consistent (its index inside its
// count, a path for every folder) and re-encode to the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/manifest.h"
#include "io/stripe_marker.h"

namespace {

void DecodeAndCheck(const std::string& bytes) {
  namespace si = strata::swap_internal;
  auto m = si::DecodeStripeMarker(bytes, "fuzz/strata.stripe");
  if (!m.ok()) return;
  if (m->count == 0 || m->index >= m->count || m->folders.size() != m->count) {
    std::fprintf(stderr, "accepted an inconsistent marker\n");
    std::abort();
  }
  if (si::EncodeStripeMarker(*m) != bytes) {
    std::fprintf(stderr, "accepted bytes that do not re-encode to themselves\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  DecodeAndCheck(bytes);
  // The seal is the last line, "xxh3 <16 hex digits>\n": recompute it over what precedes.
  const size_t seal = bytes.rfind("xxh3 ");
  if (seal != std::string::npos) {
    const std::string body = bytes.substr(0, seal);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(
                      strata::swap_internal::Checksum64(body.data(), body.size())));
    DecodeAndCheck(body + "xxh3 " + hex + "\n");
  }
  return 0;
}
