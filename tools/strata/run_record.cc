// The configuration a run records and resumes with; see run_record.h.
#include "tools/strata/run_record.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <system_error>
#include <tuple>
#include <utility>

#include "strata/input_file.h"

namespace strata::cli {
namespace {

std::string Quote(const std::string& s) {
  // A TOML basic string; CLI11 reads back what is between the quotes as is, so text with a
  // double quote or a backslash goes in a literal string (single quotes) instead.
  if (s.find_first_of("\"\\") != std::string::npos && s.find('\'') == std::string::npos) {
    return "'" + s + "'";
  }
  return "\"" + s + "\"";
}

template <typename T>
std::string Number(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <typename T>
bool ParseNumber(const std::string& text, T* out) {
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, *out);
  return r.ec == std::errc() && r.ptr == end;
}

std::string Hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

constexpr char kSealPrefix[] = "# xxh3-64 of the text above: ";
constexpr size_t kMaxRecordBytes = 1 << 20;

// The record's text, checked whole: present, not empty, not too long, sealed, and its seal
// matches. Messages never echo the file's bytes (they may be anything).
Result<std::string> ReadSealedRecord(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--resume: the run record " + path + " " + why +
                                   "; the run cannot be resumed from it. Restore the record "
                                   "from a copy of the folder, or start a fresh run")
        .WithPath(path);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "--resume: " + path).WithPath(path);
  std::string text;
  std::vector<char> buf(1 << 16);
  ssize_t n;
  while (text.size() <= kMaxRecordBytes && (n = ::read(fd, buf.data(), buf.size())) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "--resume: reading " + path).WithPath(path);
    }
    text.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  if (text.empty()) return bad("is empty (truncated, or emptied)");
  if (text.size() > kMaxRecordBytes) return bad("is longer than a record can be (1 MiB)");
  // The seal: the last line, "# xxh3-64 of the text above: <16 hex digits>\n".
  const size_t seal_len = sizeof(kSealPrefix) - 1 + 16 + 1;
  const size_t body_len = text.size() >= seal_len ? text.size() - seal_len : 0;
  if (text.size() < seal_len || text.back() != '\n' ||
      text.compare(body_len, sizeof(kSealPrefix) - 1, kSealPrefix) != 0 ||
      (body_len > 0 && text[body_len - 1] != '\n')) {
    return bad(
        "does not end with its checksum line (truncated, damaged, or written by a "
        "strata before records were sealed)");
  }
  const std::string body = text.substr(0, body_len);
  if (SealRunRecord(body) != text) {
    return bad("fails its checksum: it was edited or damaged since the run wrote it");
  }
  return body;
}

}  // namespace

std::string AbsolutePath(const std::string& p) {
  if (p.empty()) return p;
  std::error_code ec;
  const std::filesystem::path a = std::filesystem::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

std::string TomlValue(const Setting& s) {
  return std::visit(
      [&](auto* v) -> std::string {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return *v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return Quote(s.path ? AbsolutePath(*v) : *v);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string out = "[";
          for (size_t i = 0; i < v->size(); ++i) {
            out += (i ? ", " : "") + Quote(s.path ? AbsolutePath((*v)[i]) : (*v)[i]);
          }
          return out + "]";
        } else {
          return Number(*v);
        }
      },
      s.value);
}

std::string TomlTable(const std::string& section, const std::vector<Setting>& settings) {
  std::string out = "[" + section + "]\n";
  for (const Setting& s : settings) out += std::string(s.key) + " = " + TomlValue(s) + "\n";
  return out;
}

Status SetFromToml(const Setting& s, const std::vector<std::string>& inputs) {
  auto bad = [&] {
    return Status::InvalidArgument(std::string(s.key) + " = " + CLI::detail::join(inputs) +
                                   ": not a value of this setting");
  };
  return std::visit(
      [&](auto* v) -> Status {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          *v = inputs;
          // An empty TOML array reads back as one empty string.
          if (v->size() == 1 && v->front().empty()) v->clear();
          return Status::OK();
        } else {
          if (inputs.size() != 1) return bad();
          const std::string& text = inputs[0];
          if constexpr (std::is_same_v<T, bool>) {
            if (text != "true" && text != "false") return bad();
            *v = text == "true";
          } else if constexpr (std::is_same_v<T, std::string>) {
            *v = text;
          } else {
            T parsed{};
            if (!ParseNumber(text, &parsed)) return bad();
            *v = parsed;
          }
          return Status::OK();
        }
      },
      s.value);
}

std::string NewRunId() {
  unsigned char bits[16] = {};
  size_t got = 0;
  while (got < sizeof bits) {
    const ssize_t n = ::getrandom(bits + got, sizeof bits - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    if (n < 0 && errno != EINTR) break;
  }
  if (got < sizeof bits) {
    // No getrandom: the time and the pid still tell two runs apart.
    std::random_device rd;
    for (unsigned char& b : bits) b = static_cast<unsigned char>(rd());
    const uint64_t t =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        static_cast<uint64_t>(::getpid());
    for (int i = 0; i < 8; ++i) bits[i] ^= static_cast<unsigned char>(t >> (8 * i));
  }
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", bits[i]);
  return std::string(hex, 32);
}

std::string StoreRunId(const std::string& run_id, int rank, int world_size) {
  return run_id + " rank " + std::to_string(rank) + " of " + std::to_string(world_size);
}

Result<FileHash> HashFile(const std::string& flag, const std::string& path) {
  // A regular file only (a FIFO would wait for a writer forever).
  STRATA_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(path, flag));
  const int fd = file.fd();
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buf(1 << 20);
  uint64_t bytes = 0;
  ssize_t n;
  for (;;) {  // a read a signal interrupted is retried, as InputFile::ReadAll does
    n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    XXH3_64bits_update(state, buf.data(), static_cast<size_t>(n));
    bytes += static_cast<uint64_t>(n);
  }
  const int read_errno = errno;
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (n < 0) return Status::FromErrno(read_errno, flag + " " + path + ": read").WithPath(path);
  return FileHash{bytes, Hex64(hash)};
}

std::string SealRunRecord(const std::string& body) {
  return body + kSealPrefix + Hex64(XXH3_64bits(body.data(), body.size())) + "\n";
}

std::string RunRecordText(const std::vector<Setting>& settings, const RunIdentity& identity,
                          const std::optional<StateConversion>& conversion) {
  std::string out =
      "# strata train: the configuration of the run whose swap store is in this folder,\n"
      "# written when the store was created. `strata train --resume DIR` continues it with\n"
      "# these settings; do not edit (the last line is a checksum of the rest).\n";
  out += TomlTable("train", settings);
  out += "\n[identity]\n";
  if (!identity.run_id.empty()) out += "run-id = \"" + identity.run_id + "\"\n";
  out += "rank = " + std::to_string(identity.rank) + "\n";
  out += "world-size = " + std::to_string(identity.world_size) + "\n";
  if (!identity.cuda_kernels.empty()) out += "cuda-kernels = \"" + identity.cuda_kernels + "\"\n";
  for (const auto& [name, file] :
       {std::pair{"data", &identity.data}, std::pair{"tokenizer", &identity.tokenizer}}) {
    if (!file->bytes) continue;
    out += std::string(name) + "-bytes = " + std::to_string(*file->bytes) + "\n";
    out += std::string(name) + "-xxh3 = \"" + file->xxh3 + "\"\n";
  }
  if (conversion) {
    out += "\n[state-conversion]\n";
    out += "to = \"" + conversion->to + "\"\n";
    out += "after-step = " + std::to_string(conversion->after_step) + "\n";
  }
  return SealRunRecord(out);
}

Status WriteRunRecord(const std::string& folder, const std::string& text) {
  const std::string tmp_name = std::string(kRunRecordFile) + ".tmp";
  const std::string path = folder + "/" + kRunRecordFile;
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return Status::FromErrno(errno, "open folder " + folder).WithPath(folder);
  auto fail = [&](const std::string& what) {
    const int e = errno;
    ::unlinkat(dir, tmp_name.c_str(), 0);
    ::close(dir);
    return Status::FromErrno(e, what + " " + path).WithPath(path);
  };
  ::unlinkat(dir, tmp_name.c_str(), 0);  // a leftover of a killed run
  const int fd =
      ::openat(dir, tmp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fail("create");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      ::close(fd);
      return fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return fail("fsync");
  }
  ::close(fd);
  if (::renameat(dir, tmp_name.c_str(), dir, kRunRecordFile) != 0) return fail("rename to");
  if (::fsync(dir) != 0) return fail("fsync the folder of");
  ::close(dir);
  return Status::OK();
}

Result<std::optional<RunRecord>> ReadRunRecord(const std::string& folder) {
  const std::string path = folder + "/" + kRunRecordFile;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<RunRecord>();
    return Status::FromErrno(errno, "--resume: " + path).WithPath(path);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("--resume: " + path + " is not a regular file").WithPath(path);
  }
  STRATA_ASSIGN_OR_RETURN(const std::string body, ReadSealedRecord(path));
  std::vector<CLI::ConfigItem> items;
  try {
    std::istringstream in(body);
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& e) {
    return Status::InvalidArgument("--resume: " + path + ": " + e.what()).WithPath(path);
  }
  RunRecord r;
  r.path = path;
  std::optional<StateConversion> conversion;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // CLI11's section markers
    const std::string section = item.parents.empty() ? "" : item.parents[0];
    if (section == "train") {
      r.train.emplace_back(item.name, item.inputs);
      continue;
    }
    const std::string value = item.inputs.empty() ? "" : item.inputs[0];
    if (section == "state-conversion") {
      if (!conversion) conversion.emplace();
      bool ok = false;
      if (item.name == "to") {
        conversion->to = value;
        ok = !value.empty();
      } else if (item.name == "after-step") {
        ok = ParseNumber(value, &conversion->after_step);
      }
      if (!ok) {
        return Status::InvalidArgument("--resume: " + path + ": unexpected entry " + section + "." +
                                       item.name + " = " + value)
            .WithPath(path);
      }
      continue;
    }
    RunIdentity& id = r.identity;
    bool ok = true;
    auto bytes = [&](FileHash* f) {
      uint64_t b = 0;
      ok = ParseNumber(value, &b);
      f->bytes = b;
    };
    if (section != "identity") {
      ok = false;
    } else if (item.name == "run-id") {
      id.run_id = value;
    } else if (item.name == "rank") {
      ok = ParseNumber(value, &id.rank);
    } else if (item.name == "world-size") {
      ok = ParseNumber(value, &id.world_size);
    } else if (item.name == "cuda-kernels") {
      id.cuda_kernels = value;
    } else if (item.name == "data-bytes") {
      bytes(&id.data);
    } else if (item.name == "data-xxh3") {
      id.data.xxh3 = value;
    } else if (item.name == "tokenizer-bytes") {
      bytes(&id.tokenizer);
    } else if (item.name == "tokenizer-xxh3") {
      id.tokenizer.xxh3 = value;
    } else {
      ok = false;
    }
    if (!ok) {
      return Status::InvalidArgument("--resume: " + path + ": unexpected entry " + section + "." +
                                     item.name + " = " + value)
          .WithPath(path);
    }
  }
  r.conversion = std::move(conversion);
  return std::optional<RunRecord>(std::move(r));
}

void ResolveStateConversion(std::optional<uint64_t> committed_step, RunRecord* r) {
  if (!r->conversion) return;
  const StateConversion c = *std::exchange(r->conversion, std::nullopt);
  if (!committed_step || *committed_step <= c.after_step) return;
  bool found = false;
  for (auto& [key, inputs] : r->train) {
    if (key != "state-dtype") continue;
    inputs = {c.to};
    found = true;
  }
  if (!found) r->train.emplace_back("state-dtype", std::vector<std::string>{c.to});
}

Status MergeRecord(const RunRecord& record, const std::vector<Setting>& settings,
                   const std::function<bool(const std::string&)>& given,
                   const std::function<Status(RunIdentity*)>& identity, bool allow_schedule_change,
                   std::vector<std::string>* applied) {
  std::vector<std::string> refused;
  // "--data: A -> B" when the path of a file whose content is recorded differs.
  std::map<std::string, std::string> moved;
  for (const auto& entry : record.train) {
    // Not a structured binding: clang 14 lambdas (the libFuzzer build) cannot capture one.
    const std::string& key = entry.first;
    const std::vector<std::string>& inputs = entry.second;
    const Setting* s = nullptr;
    for (const Setting& candidate : settings) {
      if (key == candidate.key) s = &candidate;
    }
    if (s == nullptr) {
      return Status::InvalidArgument("--resume: " + record.path + " records " + key +
                                     ", which this strata does not know; resume with the strata "
                                     "that started the run")
          .WithPath(record.path);
    }
    if (!given(key)) {
      STRATA_RETURN_IF_ERROR(SetFromToml(*s, inputs));
      continue;
    }
    // Compare in one form: the recorded value read into a copy of the flag's type.
    const std::string now = TomlValue(*s);
    std::string was;
    std::visit(
        [&](auto* v) {
          auto copy = *v;
          Setting tmp = *s;
          tmp.value = &copy;
          if (SetFromToml(tmp, inputs).ok()) {
            was = TomlValue(tmp);
          } else {
            was = CLI::detail::join(inputs);
          }
        },
        s->value);
    if (now == was) continue;
    const std::string line = "--" + std::string(key) + ": " + was + " -> " + now;
    const bool free = s->on_resume == OnResume::kFree ||
                      (s->on_resume == OnResume::kSchedule && allow_schedule_change);
    if (free) {
      applied->push_back(line);
    } else if (key == "data" || key == "tokenizer") {
      moved[key] = line;  // refused below unless the content is the recorded one
    } else {
      refused.push_back(line + (s->on_resume == OnResume::kSchedule
                                    ? " (the learning-rate schedule: --allow-schedule-change)"
                                : key == "state-dtype"
                                    ? " (the Adam moments' format: --allow-state-dtype-change "
                                      "converts them)"
                                    : ""));
    }
  }
  RunIdentity id;
  STRATA_RETURN_IF_ERROR(identity(&id));
  const RunIdentity& was = record.identity;
  if (id.world_size != was.world_size) {
    refused.push_back("ranks (WORLD_SIZE): " + std::to_string(was.world_size) + " -> " +
                      std::to_string(id.world_size));
  }
  if (id.rank != was.rank) {
    refused.push_back("rank: the folder holds the store of rank " + std::to_string(was.rank) +
                      ", this is rank " + std::to_string(id.rank) +
                      " (give each rank its own folder, e.g. --resume DIR/{rank})");
  }
  for (const auto& [key, was_file, now_file] :
       {std::tuple{"data", &was.data, &id.data},
        std::tuple{"tokenizer", &was.tokenizer, &id.tokenizer}}) {
    const bool same_content = was_file->bytes && *was_file == *now_file;
    const auto m = moved.find(key);
    if (m != moved.end()) {
      // A file moved or copied elsewhere is the same file: its content decides.
      if (same_content) {
        applied->push_back(m->second + " (the same content)");
      } else {
        refused.push_back(m->second);
      }
    } else if (!same_content && was_file->bytes && now_file->bytes) {
      refused.push_back(
          "--" + std::string(key) + " file content: " + std::to_string(*was_file->bytes) +
          " bytes, xxh3 " + was_file->xxh3 + " -> " + std::to_string(*now_file->bytes) +
          " bytes, xxh3 " + now_file->xxh3 + " (the file changed since the run started)");
    }
  }
  if (refused.empty()) return Status::OK();
  std::string m =
      "the run in " + record.path + " was started with other settings (stored -> given):";
  for (const std::string& line : refused) m += "\n  " + line;
  m += "\nresume without these flags to continue the run as it was started (or start a new run "
       "in another --nvme folder)";
  return Status::InvalidArgument(m).WithPath(record.path);
}

}  // namespace strata::cli
