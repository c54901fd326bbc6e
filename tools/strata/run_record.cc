// The configuration a run records and resumes with; see run_record.h.
#include "tools/strata/run_record.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <system_error>

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

Status HashDataFile(const std::string& path, RunIdentity* identity) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "--data " + path + ": open").WithPath(path);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buf(1 << 20);
  uint64_t bytes = 0;
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) {
    XXH3_64bits_update(state, buf.data(), static_cast<size_t>(n));
    bytes += static_cast<uint64_t>(n);
  }
  const int read_errno = errno;
  ::close(fd);
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (n < 0) return Status::FromErrno(read_errno, "--data " + path + ": read").WithPath(path);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  identity->data_bytes = bytes;
  identity->data_xxh3 = hex;
  return Status::OK();
}

std::string RunRecordText(const std::vector<Setting>& settings, const RunIdentity& identity) {
  std::string out =
      "# strata train: the configuration of the run whose swap store is in this folder,\n"
      "# written when the store was created. `strata train --resume DIR` continues it with\n"
      "# these settings; do not edit.\n";
  out += TomlTable("train", settings);
  out += "\n[identity]\nworld-size = " + std::to_string(identity.world_size) + "\n";
  if (identity.data_bytes) {
    out += "data-bytes = " + std::to_string(*identity.data_bytes) + "\n";
    out += "data-xxh3 = \"" + identity.data_xxh3 + "\"\n";
  }
  return out;
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
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    return Status::InvalidArgument("--resume: " + path + ": " + e.what()).WithPath(path);
  }
  RunRecord r;
  r.path = path;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // CLI11's section markers
    const std::string section = item.parents.empty() ? "" : item.parents[0];
    if (section == "train") {
      r.train.emplace_back(item.name, item.inputs);
      continue;
    }
    const std::string value = item.inputs.empty() ? "" : item.inputs[0];
    bool ok = section == "identity";
    if (ok && item.name == "world-size") {
      ok = ParseNumber(value, &r.identity.world_size);
    } else if (ok && item.name == "data-bytes") {
      uint64_t b = 0;
      ok = ParseNumber(value, &b);
      r.identity.data_bytes = b;
    } else if (ok && item.name == "data-xxh3") {
      r.identity.data_xxh3 = value;
    }
    if (!ok) {
      return Status::InvalidArgument("--resume: " + path + ": unexpected entry " + section + "." +
                                     item.name + " = " + value)
          .WithPath(path);
    }
  }
  return std::optional<RunRecord>(std::move(r));
}

Status MergeRecord(const RunRecord& record, const std::vector<Setting>& settings,
                   const std::function<bool(const std::string&)>& given,
                   const std::function<Status(RunIdentity*)>& identity, bool allow_schedule_change,
                   std::vector<std::string>* applied) {
  std::vector<std::string> refused;
  std::string moved_data;  // "--data: A -> B" when the path differs
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
    } else if (key == "data") {
      moved_data = line;  // refused below unless the content is the recorded one
    } else {
      refused.push_back(line + (s->on_resume == OnResume::kSchedule
                                    ? " (the learning-rate schedule: --allow-schedule-change)"
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
  const bool same_content = was.data_bytes && id.data_bytes && *was.data_bytes == *id.data_bytes &&
                            was.data_xxh3 == id.data_xxh3;
  if (!moved_data.empty()) {
    // A data file moved or copied elsewhere is the same data: its content decides.
    if (same_content) {
      applied->push_back(moved_data + " (the same content)");
    } else {
      refused.push_back(moved_data);
    }
  } else if (!same_content && was.data_bytes && id.data_bytes) {
    refused.push_back("--data file content: " + std::to_string(*was.data_bytes) + " bytes, xxh3 " +
                      was.data_xxh3 + " -> " + std::to_string(*id.data_bytes) + " bytes, xxh3 " +
                      id.data_xxh3 + " (the file changed since the run started)");
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
