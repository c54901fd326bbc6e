#include "io/manifest.h"

#include <xxhash.h>

#include <cstring>

#include "strata/bytes.h"

namespace strata::swap_internal {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'M', 'F'};
constexpr uint32_t kVersionWithoutRunId = 1;
constexpr uint32_t kVersion = 2;
constexpr uint64_t kFlagHasStep = 1;
constexpr uint32_t kMaxKeyBytes = 1 << 16;

template <typename T>
void Put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

// Reads fixed-size fields front to back; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::string* s) {
    if (b_.size() - pos_ < n) return false;
    s->assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t Checksum64(const void* data, size_t length) { return XXH3_64bits(data, length); }

std::string EncodeManifest(const Manifest& m) {
  std::string out;
  size_t approx = 64;
  for (const auto& e : m.entries) approx += 36 + e.key.size();
  out.reserve(approx + 8);
  out.append(kMagic, sizeof(kMagic));
  Put<uint32_t>(out, m.run_id.empty() ? kVersionWithoutRunId : kVersion);
  Put<uint32_t>(out, m.num_paths);
  Put<uint64_t>(out, m.stripe_bytes);
  Put<uint64_t>(out, m.capacity_bytes);
  Put<uint64_t>(out, m.step ? kFlagHasStep : 0);
  Put<uint64_t>(out, m.step.value_or(0));
  if (!m.run_id.empty()) {
    Put<uint32_t>(out, static_cast<uint32_t>(m.run_id.size()));
    out.append(m.run_id);
  }
  Put<uint64_t>(out, m.entries.size());
  for (const auto& e : m.entries) {
    Put<uint32_t>(out, static_cast<uint32_t>(e.key.size()));
    out.append(e.key);
    Put<uint64_t>(out, e.offset);
    Put<uint64_t>(out, e.length);
    Put<uint64_t>(out, e.checksum);
    Put<uint64_t>(out, e.step);
  }
  Put<uint64_t>(out, Checksum64(out.data(), out.size()));
  return out;
}

Result<Manifest> DecodeManifest(std::string_view bytes, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption("swap store manifest " + path + " is damaged (" + why +
                              "); the store cannot be opened. Restore the folder from a "
                              "checkpoint, or delete it to start a fresh store")
        .WithPath(path);
  };
  if (bytes.size() < sizeof(kMagic) + 8 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return bad("not a Strata manifest: bad magic or too short");
  }
  uint64_t stored_sum;
  std::memcpy(&stored_sum, bytes.data() + bytes.size() - 8, 8);
  if (Checksum64(bytes.data(), bytes.size() - 8) != stored_sum) {
    return bad("checksum mismatch over " + std::to_string(bytes.size()) + " bytes");
  }
  Reader r(bytes.substr(0, bytes.size() - 8));
  std::string magic;
  uint32_t version = 0;
  Manifest m;
  uint64_t flags = 0, step = 0, count = 0;
  if (!r.GetBytes(8, &magic) || !r.Get(&version) || !r.Get(&m.num_paths) ||
      !r.Get(&m.stripe_bytes) || !r.Get(&m.capacity_bytes) || !r.Get(&flags) || !r.Get(&step)) {
    return bad("truncated header");
  }
  if (version != kVersion && version != kVersionWithoutRunId) {
    return bad("format version " + std::to_string(version) + ", this build reads " +
               std::to_string(kVersionWithoutRunId) + " and " + std::to_string(kVersion));
  }
  if (version == kVersion) {
    uint32_t id_len = 0;
    if (!r.Get(&id_len) || id_len == 0 || id_len > kMaxRunIdBytes ||
        !r.GetBytes(id_len, &m.run_id)) {
      return bad("truncated or invalid run identity");
    }
  }
  if (!r.Get(&count)) return bad("truncated header");
  // Bits or a step this build would ignore: written by another format, or damaged.
  if ((flags & ~kFlagHasStep) != 0) {
    return bad("unknown flags " + std::to_string(flags & ~kFlagHasStep));
  }
  if ((flags & kFlagHasStep) == 0 && step != 0) return bad("a step without its flag");
  if (flags & kFlagHasStep) m.step = step;
  if (m.num_paths == 0 || m.stripe_bytes == 0 || m.stripe_bytes % 4096 != 0) {
    return bad("invalid geometry");
  }
  for (uint64_t i = 0; i < count; ++i) {
    ManifestEntry e;
    uint32_t key_len = 0;
    if (!r.Get(&key_len) || key_len > kMaxKeyBytes || !r.GetBytes(key_len, &e.key) ||
        !r.Get(&e.offset) || !r.Get(&e.length) || !r.Get(&e.checksum) || !r.Get(&e.step)) {
      return bad("truncated entry " + std::to_string(i) + " of " + std::to_string(count));
    }
    const uint64_t span = RoundUp(e.length, 4096);  // 0 when the rounding wraps
    if (e.offset % 4096 != 0 || e.length > m.capacity_bytes || span < e.length ||
        e.offset > m.capacity_bytes - span) {
      return bad("entry '" + e.key + "' lies outside the capacity");
    }
    m.entries.push_back(std::move(e));
  }
  if (r.pos() != bytes.size() - 8) return bad("trailing bytes after the entries");
  return m;
}

}  // namespace strata::swap_internal
