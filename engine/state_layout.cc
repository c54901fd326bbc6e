// The optimizer state's layout (strata/state_layout.h): extents, element sizes, int8 runs.
#include "strata/state_layout.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace strata {

uint32_t MomentElemBytes(StateFormat format) {
  switch (format) {
    case StateFormat::kBf16:
      return 2;
    case StateFormat::kInt8:
      return 1;
    case StateFormat::kFp32:
      break;
  }
  return 4;
}

uint32_t MasterElemBytes(MasterFormat format) {
  return format == MasterFormat::kBf16Stochastic ? 2 : 4;
}

double StateBytesPerParam(const StateFormats& formats) {
  const double scales = formats.moments == StateFormat::kInt8 ? 2.0 * 4 / kInt8StateBlock : 0;
  return MasterElemBytes(formats.master) + 2.0 * MomentElemBytes(formats.moments) + scales;
}

std::vector<Int8Run> Int8Runs(const BlockLayout& block, int rank, int world_size) {
  std::vector<Int8Run> runs;
  const uint64_t s = block.padded_numel / uint64_t(std::max(world_size, 1));
  const uint64_t s0 = uint64_t(rank) * s, s1 = s0 + s;
  uint64_t scale = 0;
  auto add = [&](uint64_t lo, uint64_t hi) {  // shard coordinates
    if (lo >= hi) return;
    runs.push_back(Int8Run{lo, hi, scale});
    scale += Int8StateBlocks(hi - lo);
  };
  for (const TensorLayout& t : block.tensors) {
    const uint64_t lo = std::max(t.offset, s0), hi = std::min(t.offset + t.numel, s1);
    if (lo >= hi) continue;
    // The first block edge at or after lo, counted from the tensor's first element.
    const uint64_t into = (lo - t.offset) % kInt8StateBlock;
    const uint64_t edge = into == 0 ? lo : std::min(hi, lo + (kInt8StateBlock - into));
    add(lo - s0, edge - s0);  // the partial block a shard boundary cut (empty when none)
    add(edge - s0, hi - s0);
  }
  return runs;
}

const StateExtent* BlockStateLayout::Extent(Component component) const {
  switch (component) {
    case Component::kMaster:
      return &master;
    case Component::kExpAvg:
      return &exp_avg;
    case Component::kExpAvgSq:
      return &exp_avg_sq;
    default:
      return nullptr;
  }
}

BlockStateLayout DescribeBlockState(const BlockLayout& block, int rank, int world_size,
                                    const StateFormats& formats) {
  BlockStateLayout l;
  l.formats = formats;
  const uint64_t n = block.shard_numel;
  const uint32_t mb = MasterElemBytes(formats.master);
  l.master = StateExtent{Component::kMaster, mb, n, n * mb, 0, n * mb};
  const uint32_t eb = MomentElemBytes(formats.moments);
  uint64_t scales = 0;
  if (formats.moments == StateFormat::kInt8) {
    l.runs = Int8Runs(block, rank, world_size);
    if (!l.runs.empty())
      scales = l.runs.back().scale + Int8StateBlocks(l.runs.back().hi - l.runs.back().lo);
  }
  for (auto [c, e] : {std::pair{Component::kExpAvg, &l.exp_avg},
                      std::pair{Component::kExpAvgSq, &l.exp_avg_sq}}) {
    *e = StateExtent{c, eb, n, n * eb, scales, n * eb + scales * 4};
  }
  return l;
}

namespace {

Status CheckLengths(const char* what, const BlockStateLayout& layout, Component component,
                    uint64_t extent_bytes, uint64_t values) {
  const StateExtent* e = layout.Extent(component);
  if (!e || component == Component::kMaster) {
    return Status::InvalidArgument(std::string(what) + ": " + ComponentName(component) +
                                   " is not a moment (exp_avg or exp_avg_sq)");
  }
  if (extent_bytes != e->bytes || values != e->values) {
    return Status::InvalidArgument(
        std::string(what) + ": " + ComponentName(component) + " of " + std::to_string(e->values) +
        " values takes " + std::to_string(e->bytes) + " bytes; got " +
        std::to_string(extent_bytes) + " bytes for " + std::to_string(values) + " values");
  }
  return Status::OK();
}

}  // namespace

Status DecodeMoment(const BlockStateLayout& layout, Component component,
                    std::span<const uint8_t> extent, std::span<float> out) {
  STRATA_RETURN_IF_ERROR(
      CheckLengths("DecodeMoment", layout, component, extent.size(), out.size()));
  switch (layout.formats.moments) {
    case StateFormat::kFp32:
      std::copy_n(reinterpret_cast<const float*>(extent.data()), out.size(), out.data());
      return Status::OK();
    case StateFormat::kBf16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, extent.data() + 2 * i, 2);
        out[i] = Bf16ToFloat(b);
      }
      return Status::OK();
    case StateFormat::kInt8:
      break;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  const float* scale = reinterpret_cast<const float*>(extent.data() + layout.exp_avg.scale_offset);
  std::vector<uint8_t> zero_code(kInt8StateBlock, 0);
  std::vector<float> zero_scale(Int8StateBlocks(out.size()) + 1, 0.0f), other(kInt8StateBlock);
  const bool first = component == Component::kExpAvg;
  for (const Int8Run& r : layout.runs) {
    // One run at a time, block by block, with zeros standing in for the other moment.
    for (uint64_t lo = r.lo; lo < r.hi; lo += kInt8StateBlock) {
      const uint64_t n = std::min<uint64_t>(kInt8StateBlock, r.hi - lo);
      const uint8_t* code = extent.data() + lo;
      const float* sc = scale + r.scale + (lo - r.lo) / kInt8StateBlock;
      STRATA_RETURN_IF_ERROR(DequantizeInt8Moments(
          first ? code : zero_code.data(), first ? zero_code.data() : code,
          first ? sc : zero_scale.data(), first ? zero_scale.data() : sc, n,
          first ? out.data() + lo : other.data(), first ? other.data() : out.data() + lo));
    }
  }
  return Status::OK();
}

Status EncodeMoment(const BlockStateLayout& layout, Component component,
                    std::span<const float> values, std::span<uint8_t> extent) {
  STRATA_RETURN_IF_ERROR(
      CheckLengths("EncodeMoment", layout, component, extent.size(), values.size()));
  switch (layout.formats.moments) {
    case StateFormat::kFp32:
      std::memcpy(extent.data(), values.data(), values.size() * 4);
      return Status::OK();
    case StateFormat::kBf16:
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t b = FloatToBf16(values[i]);
        std::memcpy(extent.data() + 2 * i, &b, 2);
      }
      return Status::OK();
    case StateFormat::kInt8:
      break;
  }
  std::fill(extent.begin(), extent.end(), uint8_t(0));
  float* scale = reinterpret_cast<float*>(extent.data() + layout.exp_avg.scale_offset);
  std::vector<float> zero(kInt8StateBlock, 0.0f);
  std::vector<uint8_t> other_code(kInt8StateBlock);
  float other_scale = 0;
  const bool first = component == Component::kExpAvg;
  for (const Int8Run& r : layout.runs) {
    for (uint64_t lo = r.lo; lo < r.hi; lo += kInt8StateBlock) {
      const uint64_t n = std::min<uint64_t>(kInt8StateBlock, r.hi - lo);
      uint8_t* code = extent.data() + lo;
      float* sc = scale + r.scale + (lo - r.lo) / kInt8StateBlock;
      STRATA_RETURN_IF_ERROR(QuantizeInt8Moments(
          first ? values.data() + lo : zero.data(), first ? zero.data() : values.data() + lo, n,
          first ? code : other_code.data(), first ? other_code.data() : code,
          first ? sc : &other_scale, first ? &other_scale : sc));
    }
  }
  return Status::OK();
}

Status DecodeMaster(const BlockStateLayout& layout, std::span<const uint8_t> extent,
                    std::span<float> out) {
  const StateExtent& e = layout.master;
  if (extent.size() != e.bytes || out.size() != e.values) {
    return Status::InvalidArgument("DecodeMaster: a master of " + std::to_string(e.values) +
                                   " values takes " + std::to_string(e.bytes) + " bytes; got " +
                                   std::to_string(extent.size()) + " bytes for " +
                                   std::to_string(out.size()) + " values");
  }
  if (e.elem_bytes == 4) {
    std::memcpy(out.data(), extent.data(), extent.size());
    return Status::OK();
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, extent.data() + 2 * i, 2);
    out[i] = Bf16ToFloat(b);
  }
  return Status::OK();
}

Status EncodeMaster(const BlockStateLayout& layout, std::span<const float> values,
                    std::span<uint8_t> extent) {
  const StateExtent& e = layout.master;
  if (extent.size() != e.bytes || values.size() != e.values) {
    return Status::InvalidArgument("EncodeMaster: a master of " + std::to_string(e.values) +
                                   " values takes " + std::to_string(e.bytes) + " bytes; got " +
                                   std::to_string(extent.size()) + " bytes for " +
                                   std::to_string(values.size()) + " values");
  }
  if (e.elem_bytes == 4) {
    std::memcpy(extent.data(), values.data(), extent.size());
    return Status::OK();
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t b = FloatToBf16(values[i]);
    std::memcpy(extent.data() + 2 * i, &b, 2);
  }
  return Status::OK();
}

}  // namespace strata
