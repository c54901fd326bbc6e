#include "model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "strata/atomic_file.h"
#include "strata/input_file.h"

namespace strata::model {
namespace {

size_t DtypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -f : f;
}

// The whole file, which must be a regular file (a folder, a FIFO or a device is refused
// by name, never waited on or sized by lseek).
Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out) {
  STRATA_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(path, "safetensors file"));
  if (file.size() > out->max_size()) {
    return Status::OutOfMemory("safetensors file " + path + " is larger than this host can hold")
        .WithPath(path);
  }
  out->resize(static_cast<size_t>(file.size()));
  return file.ReadAt(0, out->data(), out->size());
}

// The tensors' byte ranges must tile the data section: no two overlap (one write would
// change two tensors), and no byte lies outside every tensor (hidden data).
Status CheckLayout(const std::map<std::string, TensorEntry>& tensors, uint64_t data_size,
                   const std::string& path) {
  std::vector<std::pair<uint64_t, const std::string*>> by_begin;
  for (const auto& [name, t] : tensors) {
    if (t.end > t.begin) by_begin.emplace_back(t.begin, &name);
  }
  std::sort(by_begin.begin(), by_begin.end());
  uint64_t covered = 0;
  const std::string* prev = nullptr;
  for (const auto& [begin, name] : by_begin) {
    const TensorEntry& t = tensors.at(*name);
    if (begin < covered) {
      return Status::Corruption("safetensors file " + path + ": tensors " + *prev + " and " +
                                *name + " overlap (bytes " + std::to_string(begin) + " to " +
                                std::to_string(std::min(covered, t.end)) + " of the data section)")
          .WithPath(path);
    }
    if (begin > covered) {
      return Status::Corruption("safetensors file " + path + ": bytes " + std::to_string(covered) +
                                " to " + std::to_string(begin) +
                                " of the data section belong to no tensor")
          .WithPath(path);
    }
    covered = t.end;
    prev = name;
  }
  if (covered != data_size) {
    return Status::Corruption("safetensors file " + path + ": the last " +
                              std::to_string(data_size - covered) +
                              " bytes of the data section belong to no tensor")
        .WithPath(path);
  }
  return Status::OK();
}

}  // namespace

int64_t TensorEntry::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  std::vector<uint8_t> bytes;
  STRATA_RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
  auto corrupt = [&](const std::string& m) {
    return Status::Corruption("safetensors file " + path + ": " + m).WithPath(path);
  };
  if (bytes.size() < 8) {
    return corrupt("file is " + std::to_string(bytes.size()) +
                   " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > bytes.size() - 8) {
    return corrupt("header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(bytes.size() - 8) + " bytes after it (truncated file?)");
  }
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_len,
                                                nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return corrupt("header is not a JSON object");
  }
  SafetensorsReader r;
  r.path_ = path;
  const uint64_t data_size = bytes.size() - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it.value().is_object()) return corrupt("__metadata__ is not a JSON object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (m.value().is_string()) r.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return corrupt("tensor " + name +
                     ": expected {\"dtype\": string, \"shape\": [..], \"data_offsets\": "
                     "[begin, end]}");
    }
    TensorEntry t;
    t.dtype = e["dtype"].get<std::string>();
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return corrupt("tensor " + name + ": shape must hold non-negative integers");
      }
      t.shape.push_back(d.get<int64_t>());
    }
    for (int i = 0; i < 2; ++i) {
      if (!e["data_offsets"][i].is_number_unsigned() && !e["data_offsets"][i].is_number_integer()) {
        return corrupt("tensor " + name + ": data_offsets must be integers");
      }
    }
    t.begin = e["data_offsets"][0].get<uint64_t>();
    t.end = e["data_offsets"][1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size) {
      return corrupt("tensor " + name + ": data_offsets [" + std::to_string(t.begin) + ", " +
                     std::to_string(t.end) + "] outside the data section of " +
                     std::to_string(data_size) + " bytes (truncated file?)");
    }
    const size_t eb = DtypeBytes(t.dtype);
    if (eb == 0) return corrupt("tensor " + name + ": unknown dtype " + t.dtype);
    // The byte size in overflow-safe arithmetic: a shape whose product wraps must not match.
    uint64_t want = eb;
    bool overflow = false;
    for (int64_t d : t.shape) {
      overflow = overflow || __builtin_mul_overflow(want, static_cast<uint64_t>(d), &want);
    }
    if (overflow) {
      return corrupt("tensor " + name + ": shape " + ShapeString(t.shape) +
                     " has more bytes than 64 bits can count");
    }
    if (t.end - t.begin != want) {
      return corrupt("tensor " + name + ": " + t.dtype + " " + ShapeString(t.shape) + " needs " +
                     std::to_string(want) + " bytes, data_offsets give " +
                     std::to_string(t.end - t.begin));
    }
    r.tensors_.emplace(name, std::move(t));
  }
  STRATA_RETURN_IF_ERROR(CheckLayout(r.tensors_, data_size, path));
  r.data_.assign(bytes.begin() + 8 + static_cast<int64_t>(header_len), bytes.end());
  return r;
}

const TensorEntry* SafetensorsReader::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsReader::ReadFloat(const std::string& name,
                                    const std::vector<int64_t>& expected_shape, float* out,
                                    size_t out_elems) const {
  const TensorEntry* t = Find(name);
  if (t == nullptr) {
    return Status::NotFound("safetensors file " + path_ + " has no tensor " + name +
                            " (expected shape " + ShapeString(expected_shape) + ")")
        .WithPath(path_);
  }
  if (t->shape != expected_shape) {
    return Status::InvalidArgument("tensor " + name + " in " + path_ + " has shape " +
                                   ShapeString(t->shape) + ", expected " +
                                   ShapeString(expected_shape))
        .WithPath(path_);
  }
  const size_t n = static_cast<size_t>(t->NumElements());
  if (n != out_elems) {
    return Status::InvalidArgument("tensor " + name + ": " + std::to_string(n) +
                                   " elements, caller's buffer holds " + std::to_string(out_elems));
  }
  const uint8_t* src = data_.data() + t->begin;
  if (t->dtype == "F32") {
    if (n > 0) std::memcpy(out, src, n * 4);  // an empty tensor may come with a null buffer
  } else if (t->dtype == "BF16" || t->dtype == "F16") {
    const bool bf = t->dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
      out[i] = bf ? Bf16ToFloat(h) : F16ToFloat(h);
    }
  } else {
    return Status::NotSupported("tensor " + name + " in " + path_ + " has dtype " + t->dtype +
                                "; only F32, BF16 and F16 are supported")
        .WithPath(path_);
  }
  return Status::OK();
}

Result<std::string> SafetensorsPrefix(const std::vector<TensorToWrite>& tensors,
                                      const std::string& dtype,
                                      const std::map<std::string, std::string>& metadata) {
  const uint64_t elem = dtype == "F32" ? 4 : dtype == "BF16" ? 2 : 0;
  if (elem == 0) return Status::InvalidArgument("safetensors dtype " + dtype + ": F32 or BF16");
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (!seen.insert(t.name).second) {
      return Status::InvalidArgument("duplicate tensor name " + t.name);
    }
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * elem;
    header[t.name] = {
        {"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // data section 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
  return out + h;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  auto prefix = SafetensorsPrefix(tensors, "F32", metadata);
  if (!prefix.ok()) return Status::InvalidArgument(prefix.status().message() + " for " + path);
  STRATA_ASSIGN_OR_RETURN(auto out, AtomicFile::Create(path));
  STRATA_RETURN_IF_ERROR(out->Write(*prefix));
  for (const TensorToWrite& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    STRATA_RETURN_IF_ERROR(out->Write(
        {reinterpret_cast<const char*>(t.data), static_cast<size_t>(n) * sizeof(float)}));
  }
  STRATA_RETURN_IF_ERROR(out->Commit());
  return Status::OK();
}

}  // namespace strata::model
