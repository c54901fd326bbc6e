// The streaming writer of `strata export`; see export_writer.h.
#include "tools/strata/export_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "model/gpt2.h"
#include "model/safetensors.h"
#include "strata/atomic_file.h"
#include "strata/optim.h"
#include "strata/state_layout.h"

namespace strata::cli {

namespace {

float Bf16ToFloat(uint16_t v) {
  const uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Appends n elements of `src` (src_bytes each: 4 fp32, 2 bf16) to `out` as out_bytes each
// (the other of the two).
void Convert(const uint8_t* src, uint64_t n, uint64_t src_bytes, uint64_t out_bytes,
             std::string* out) {
  const size_t at = out->size();
  out->resize(at + n * out_bytes);
  char* dst = out->data() + at;
  if (src_bytes == 4) {  // fp32 -> bf16
    for (uint64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, src + 4 * i, 4);
      const uint16_t h = FloatToBf16(f);
      std::memcpy(dst + 2 * i, &h, 2);
    }
  } else {  // bf16 -> fp32
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const float f = Bf16ToFloat(h);
      std::memcpy(dst + 4 * i, &f, 4);
    }
  }
}

Status WriteAt(int fd, std::string_view bytes, uint64_t offset, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd, bytes.data(), bytes.size(), off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "writing " + path).WithPath(path);
    bytes.remove_prefix(size_t(n));
    offset += uint64_t(n);
  }
  return Status::OK();
}

// Gathers the pieces written at consecutive offsets (a rank's extent of a block lands on
// consecutive tensors of the file) into large writes, and starts the kernel's writeback of
// what was written every kKick bytes (sync_file_range, which does not wait), so that the
// disk writes while the next extents are read instead of all at Commit's fsync; the page
// cache holds at most about kKick bytes of the output dirty.
class CoalescedWriter {
 public:
  static constexpr uint64_t kBuffer = 8ull << 20, kKick = 64ull << 20;
  CoalescedWriter(int fd, const std::string& path) : fd_(fd), path_(path) { buf_.reserve(kBuffer); }

  Status Write(std::string_view bytes, uint64_t offset) {
    if (!buf_.empty() && (offset != at_ + buf_.size() || buf_.size() + bytes.size() > kBuffer)) {
      STRATA_RETURN_IF_ERROR(Flush());
    }
    if (buf_.empty()) at_ = offset;
    if (bytes.size() >= kBuffer) return Put(bytes, offset);
    buf_.append(bytes);
    return Status::OK();
  }
  Status Flush() {
    if (buf_.empty()) return Status::OK();
    Status s = Put(buf_, at_);
    buf_.clear();
    return s;
  }

 private:
  Status Put(std::string_view bytes, uint64_t offset) {
    STRATA_RETURN_IF_ERROR(WriteAt(fd_, bytes, offset, path_));
    dirty_ += bytes.size();
    if (dirty_ >= kKick) {
      (void)sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);  // a hint: failures show at fsync
      dirty_ = 0;
    }
    return Status::OK();
  }
  int fd_;
  const std::string& path_;
  std::string buf_;
  uint64_t at_ = 0, dirty_ = 0;
};

}  // namespace

ExportPlan PlanExport(const RunStore& store, const std::string& prefix, uint64_t out_elem_bytes) {
  ExportPlan p;
  p.out_elem_bytes = out_elem_bytes;
  for (size_t b = 0; b < store.specs.size(); ++b) {
    for (size_t t = 0; t < store.specs[b].tensors.size(); ++t) {
      const TensorLayout& tl = store.layouts[b].tensors[t];
      p.tensors.push_back(ExportTensor{prefix + model::HfTensorName(store.specs, int(b), int(t)),
                                       tl.shape, int(b), tl.offset, tl.numel});
      p.data_bytes += tl.numel * out_elem_bytes;
    }
  }
  return p;
}

std::vector<ExportFile> SplitIntoShards(const ExportPlan& plan, uint64_t max_bytes,
                                        const std::string& single) {
  std::vector<ExportFile> files;
  uint64_t bytes = 0;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const uint64_t n = plan.tensors[t].numel * plan.out_elem_bytes;
    if (files.empty() || (bytes > 0 && bytes + n > max_bytes)) {
      files.push_back(ExportFile{"", t, t});
      bytes = 0;
    }
    files.back().last = t + 1;
    bytes += n;
  }
  if (files.size() == 1) {
    files[0].path = single;
    return files;
  }
  const std::filesystem::path folder = std::filesystem::path(single).parent_path();
  char name[64];
  for (size_t i = 0; i < files.size(); ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, files.size());
    files[i].path = (folder / name).string();
  }
  return files;
}

Status WriteExportFile(RunStore& store, const ExportPlan& plan, const ExportFile& file,
                       const std::string& component,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<model::TensorToWrite> header;
  for (size_t t = file.first; t < file.last; ++t) {
    header.push_back({plan.tensors[t].name, plan.tensors[t].shape, nullptr});
  }
  STRATA_ASSIGN_OR_RETURN(
      std::string prefix,
      model::SafetensorsPrefix(header, plan.out_elem_bytes == 2 ? "BF16" : "F32", metadata));
  STRATA_ASSIGN_OR_RETURN(auto out, AtomicFile::Create(file.path));
  STRATA_RETURN_IF_ERROR(out->Write(prefix));
  if (std::fflush(out->stream()) != 0) {
    return Status::FromErrno(errno, "writing " + file.path).WithPath(file.path);
  }
  const int fd = fileno(out->stream());
  const uint64_t src_bytes = ElementBytes(store, component);
  if (src_bytes == 0) {
    return Status::NotSupported("the Adam moments are stored as " + store.state_dtype +
                                ", which this export does not read; export without "
                                "--with-optimizer");
  }
  const uint64_t ob = plan.out_elem_bytes;
  // Where each tensor's bytes go in the file, and each block's tensors in this file.
  std::vector<uint64_t> at(file.last - file.first);
  std::map<int, std::pair<size_t, size_t>> blocks;  // block -> its tensors [first, last)
  uint64_t pos = prefix.size();
  for (size_t t = file.first; t < file.last; ++t) {
    at[t - file.first] = pos;
    pos += plan.tensors[t].numel * ob;
    auto [it, fresh] = blocks.try_emplace(plan.tensors[t].block, t, t + 1);
    if (!fresh) it->second.second = t + 1;
  }
  uint64_t written = 0;
  std::string buf;
  CoalescedWriter writer(fd, file.path);
  // Rank by rank, every extent of the rank this file needs in one Read, so that the queue
  // stays full across them; each piece's part of each tensor is written where it belongs.
  for (RankStore& r : store.ranks) {
    std::vector<std::string> keys;
    std::vector<int> key_block;
    for (const auto& [b, range] : blocks) {
      const uint64_t shard = store.layouts[b].shard_numel, s0 = uint64_t(r.rank) * shard;
      const ExportTensor &lo = plan.tensors[range.first], &hi = plan.tensors[range.second - 1];
      if (s0 + shard <= lo.offset || s0 >= hi.offset + hi.numel) continue;
      keys.push_back(ExtentKey(b, component));
      key_block.push_back(b);
    }
    // Full-block elements [g0, g0 + count) of block b, `eb` bytes each, to their tensors.
    auto place = [&](int b, uint64_t g0, const uint8_t* data, uint64_t count,
                     uint64_t eb) -> Status {
      const uint64_t g1 = g0 + count;
      for (size_t t = blocks[b].first; t < blocks[b].second; ++t) {
        const ExportTensor& x = plan.tensors[t];
        const uint64_t a = std::max(g0, x.offset), z = std::min(g1, x.offset + x.numel);
        if (a >= z) continue;
        const uint8_t* src = data + (a - g0) * eb;
        std::string_view piece(reinterpret_cast<const char*>(src), (z - a) * ob);
        if (eb != ob) {
          buf.clear();
          Convert(src, z - a, eb, ob, &buf);
          piece = buf;
        }
        STRATA_RETURN_IF_ERROR(writer.Write(piece, at[t - file.first] + (a - x.offset) * ob));
        written += piece.size();
      }
      return Status::OK();
    };
    // Int8 moments: codes, then their scales (strata/state_layout.h); each extent is kept
    // whole and dequantized once its last piece arrived.
    std::vector<uint8_t> whole;
    std::vector<float> values;
    auto sink = [&](size_t k, uint64_t offset, std::span<const uint8_t> bytes) -> Status {
      const int b = key_block[k];
      const uint64_t s0 = uint64_t(r.rank) * store.layouts[b].shard_numel;
      if (src_bytes != 1)
        return place(b, s0 + offset / src_bytes, bytes.data(), bytes.size() / src_bytes, src_bytes);
      if (offset == 0) whole.clear();
      whole.insert(whole.end(), bytes.begin(), bytes.end());
      const BlockStateLayout st = DescribeBlockState(store.layouts[b], r.rank, store.world_size,
                                                     StateFormats{StateFormat::kInt8});
      if (whole.size() < st.exp_avg.bytes) return Status::OK();
      values.resize(st.exp_avg.values);
      STRATA_RETURN_IF_ERROR(DecodeMoment(
          st, component == "exp_avg" ? Component::kExpAvg : Component::kExpAvgSq, whole, values));
      return place(b, s0, reinterpret_cast<const uint8_t*>(values.data()), values.size(), 4);
    };
    STRATA_RETURN_IF_ERROR(r.reader->Read(keys, sink).Annotate("rank " + std::to_string(r.rank)));
  }
  STRATA_RETURN_IF_ERROR(writer.Flush());
  uint64_t want = 0;
  for (size_t t = file.first; t < file.last; ++t) want += plan.tensors[t].numel * ob;
  if (written != want) {
    return Status::Aborted("internal: export wrote " + std::to_string(written) + " bytes of " +
                           file.path + "'s tensors, not " + std::to_string(want));
  }
  return out->Commit();
}

}  // namespace strata::cli
