// The stripe marker and the checks on a store's folders; see stripe_marker.h.
#include "io/stripe_marker.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "io/manifest.h"
#include "io/swap_folders.h"

namespace strata::swap_internal {
namespace {

constexpr char kMagicLine[] = "strata swap store folder 1";
constexpr char kTemporaryName[] = "strata.stripe.tmp";
constexpr char kManifestName[] = "strata.manifest";

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ToHex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out = "x";
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// Hex text behind an 'x' (so that empty bytes are still a word on their line).
bool FromHex(const std::string& text, std::string* out) {
  if (text.empty() || text[0] != 'x' || text.size() % 2 != 1) return false;
  const std::string hex = text.substr(1);
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    char* end = nullptr;
    const std::string pair = hex.substr(i, 2);
    const long v = std::strtol(pair.c_str(), &end, 16);
    if (end != pair.c_str() + 2) return false;
    out->push_back(static_cast<char>(v));
  }
  return true;
}

std::string Absolute(const std::string& folder) {
  char buf[PATH_MAX];
  return realpath(folder.c_str(), buf) != nullptr ? std::string(buf) : folder;
}

// The committed manifest of a store's folder 0 (nullopt when it has none or it cannot be read).
std::optional<Manifest> PeekManifest(const std::string& folder) {
  const int dir = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return std::nullopt;
  const std::string path = JoinPath(folder, kManifestName);
  Result<std::string> bytes = ReadWholeFile(dir, kManifestName, path);
  close(dir);
  if (!bytes.ok()) return std::nullopt;
  Result<Manifest> m = DecodeManifest(*bytes, path);
  if (!m.ok()) return std::nullopt;
  return std::move(m).value();
}

std::string RunName(const std::string& run_id) {
  return run_id.empty() ? "a run without identity" : "run '" + run_id + "'";
}

std::string FolderOf(const StripeMarker& m) {
  return "folder " + std::to_string(m.index) + " of " + std::to_string(m.count);
}

// The store's folders in their order, as a command line would give them: where a folder of
// the store was given, that path; folder 0 where it was made; else "?".
std::string OrderHint(const StripeMarker& ref, const std::vector<std::string>& paths,
                      const std::vector<std::optional<StripeMarker>>& markers) {
  std::string out;
  for (uint32_t k = 0; k < ref.count; ++k) {
    std::string where = k < ref.folders.size() ? ref.folders[k] : "?";
    for (size_t i = 0; i < paths.size(); ++i) {
      if (markers[i] && markers[i]->store_id == ref.store_id && markers[i]->index == k) {
        where = paths[i];
      }
    }
    if (!out.empty()) out += ' ';
    out += "--nvme ";
    out += where;
  }
  return out;
}

// Resume: every folder given is the store's, at its own place, and none is missing.
Status CheckResumed(const std::vector<std::string>& paths,
                    const std::vector<std::optional<StripeMarker>>& markers) {
  const StripeMarker* ref = nullptr;
  for (const auto& m : markers) {
    if (m && (ref == nullptr || m->index == 0)) ref = &*m;
    if (ref != nullptr && ref->index == 0) break;
  }
  if (ref == nullptr) return Status::OK();  // no markers: no store, or one made before them
  // Folder 0 given first with a manifest and no marker: a store made before markers.
  if (!markers[0] && SwapFolders::HasManifest(paths[0])) return Status::OK();
  std::vector<std::string> problems;
  std::vector<bool> found(ref->count, false);
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string given = paths[i] + " (given as folder " + std::to_string(i) + ")";
    const auto& m = markers[i];
    if (!m) {
      problems.push_back(given + " holds no part of this store");
    } else if (m->store_id != ref->store_id) {
      problems.push_back(given + " belongs to another store, of " + RunName(m->run_id));
    } else {
      if (m->index < ref->count) found[m->index] = true;
      if (m->index != i || ref->count != paths.size()) {
        if (m->index != i) problems.push_back(given + " is the store's " + FolderOf(*m));
      }
    }
  }
  for (uint32_t k = 0; k < ref->count; ++k) {
    if (found[k]) continue;
    problems.push_back("its folder " + std::to_string(k) + " is not given" +
                       (k < ref->folders.size()
                            ? " (it was " + ref->folders[k] + " when the store was made)"
                            : std::string()));
  }
  if (problems.empty()) return Status::OK();
  std::string list;
  for (const std::string& p : problems) list += (list.empty() ? "" : "; ") + p;
  return Status::InvalidArgument(
             "the swap store of " + RunName(ref->run_id) + " spans " + std::to_string(ref->count) +
             " folder(s), given in another order or in part: " + list +
             ". Give every folder of the store in its order (" + OrderHint(*ref, paths, markers) +
             "); nothing was changed in the folders")
      .WithPath(paths[0]);
}

}  // namespace

std::string NewStoreId() {
  uint64_t words[2] = {0, 0};
  if (getrandom(words, sizeof words, 0) != static_cast<ssize_t>(sizeof words)) {
    // No entropy source: the time and the pid still tell two stores apart in practice.
    words[0] = static_cast<uint64_t>(time(nullptr)) ^ (uint64_t(getpid()) << 32);
    words[1] = reinterpret_cast<uintptr_t>(&words) ^ uint64_t(clock());
  }
  return Hex64(words[0]) + Hex64(words[1]);
}

std::string EncodeStripeMarker(const StripeMarker& m) {
  std::string body = std::string(kMagicLine) + "\nstore " + m.store_id + "\nfolder " +
                     std::to_string(m.index) + " of " + std::to_string(m.count) + "\nrun " +
                     ToHex(m.run_id) + "\n";
  for (const std::string& f : m.folders) body += "path " + ToHex(f) + "\n";
  return body + "xxh3 " + Hex64(Checksum64(body.data(), body.size())) + "\n";
}

Result<StripeMarker> DecodeStripeMarker(std::string_view bytes, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption("swap store marker " + path + " " + why +
                              "; it says which store the folder belongs to. Restore the folder "
                              "from a copy, or remove the marker if the folder holds no store")
        .WithPath(path);
  };
  const size_t seal = bytes.rfind("xxh3 ");
  if (seal == std::string_view::npos || bytes.size() != seal + 5 + 16 + 1 || bytes.back() != '\n') {
    return bad("is truncated or damaged");
  }
  const std::string body(bytes.substr(0, seal));
  if (Hex64(Checksum64(body.data(), body.size())) != bytes.substr(seal + 5, 16)) {
    return bad("fails its checksum (damaged or edited)");
  }
  std::istringstream in(body);
  std::string magic, key, of, run_hex, path_hex;
  StripeMarker m;
  std::getline(in, magic);
  if (magic != kMagicLine) return bad("is not a marker this strata reads");
  if (!(in >> key >> m.store_id) || key != "store" || !(in >> key >> m.index >> of >> m.count) ||
      key != "folder" || of != "of" || !(in >> key >> run_hex) || key != "run" ||
      !FromHex(run_hex, &m.run_id) || m.count == 0 || m.index >= m.count) {
    return bad("does not hold a store, a folder index and a run");
  }
  while (m.folders.size() < m.count && in >> key >> path_hex) {
    std::string path;
    if (key != "path" || !FromHex(path_hex, &path)) return bad("holds a damaged folder path");
    m.folders.push_back(std::move(path));
  }
  if (m.folders.size() != m.count) return bad("does not name every folder of its store");
  // One encoding: anything else (spacing, case, signs) was not written by a store.
  if (EncodeStripeMarker(m) != bytes) return bad("is not in the form a store writes");
  return m;
}

Result<std::optional<StripeMarker>> ReadStripeMarker(const std::string& folder) {
  const std::string path = JoinPath(folder, kStripeMarkerName);
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return std::optional<StripeMarker>();
  const int dir = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return Status::FromErrno(errno, "opening folder " + folder).WithPath(folder);
  Result<std::string> bytes = ReadWholeFile(dir, kStripeMarkerName, path);
  close(dir);
  if (!bytes.ok()) return bytes.status();
  STRATA_ASSIGN_OR_RETURN(StripeMarker m, DecodeStripeMarker(*bytes, path));
  return std::optional<StripeMarker>(std::move(m));
}

Status WriteStripeMarker(int dir_fd, const std::string& folder, const StripeMarker& marker) {
  const std::string bytes = EncodeStripeMarker(marker);
  const std::string path = JoinPath(folder, kStripeMarkerName);
  (void)unlinkat(dir_fd, kTemporaryName, 0);
  const int fd =
      openat(dir_fd, kTemporaryName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "creating " + path + ".tmp").WithPath(path);
  const bool wrote = write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  const int err = errno;
  const bool synced = wrote && fsync(fd) == 0;
  close(fd);
  if (!synced) {
    (void)unlinkat(dir_fd, kTemporaryName, 0);
    return Status::FromErrno(wrote ? errno : err, "writing " + path + ".tmp").WithPath(path);
  }
  if (renameat(dir_fd, kTemporaryName, dir_fd, kStripeMarkerName) != 0 || fsync(dir_fd) != 0) {
    const int e = errno;
    (void)unlinkat(dir_fd, kTemporaryName, 0);
    return Status::FromErrno(e, "renaming the store marker over " + path).WithPath(path);
  }
  return Status::OK();
}

StripeMarker MakeStripeMarker(const std::string& store_id, const std::string& run_id,
                              uint32_t index, const std::vector<std::string>& folders) {
  StripeMarker m{store_id, run_id, index, uint32_t(folders.size()), {}};
  for (const std::string& f : folders) m.folders.push_back(Absolute(f));
  return m;
}

Status CheckStripeFolders(const std::vector<std::string>& paths, bool create,
                          std::optional<uint64_t> replace_through_step,
                          std::vector<std::optional<StripeMarker>>* markers) {
  markers->clear();
  for (const std::string& p : paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      markers->emplace_back();  // SwapFolders reports it
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(std::optional<StripeMarker> m, ReadStripeMarker(p));
    markers->push_back(std::move(m));
  }
  if (!create) return CheckResumed(paths, *markers);
  const auto& ms = *markers;
  // The folders of one whole store, in order: the caller decides about its committed state.
  const bool whole = ms[0] && ms[0]->count == paths.size() && [&] {
    for (size_t i = 0; i < ms.size(); ++i) {
      if (!ms[i] || ms[i]->store_id != ms[0]->store_id || ms[i]->index != i) return false;
    }
    return true;
  }();
  if (whole) return Status::OK();
  for (size_t i = 0; i < paths.size(); ++i) {
    if (!ms[i]) continue;
    const StripeMarker& m = *ms[i];
    // The store's folder 0: this one, one given with it, or where it was made.
    std::string first = m.index == 0 ? paths[i] : m.folders[0];
    for (size_t j = 0; j < paths.size(); ++j) {
      if (ms[j] && ms[j]->store_id == m.store_id && ms[j]->index == 0) first = paths[j];
    }
    std::optional<Manifest> manifest;
    Result<std::optional<StripeMarker>> first_marker = ReadStripeMarker(first);
    if (first_marker.ok() && *first_marker && (*first_marker)->store_id == m.store_id) {
      manifest = PeekManifest(first);
    }
    const bool found = manifest.has_value();
    const bool committed = found && manifest->step.has_value();
    const uint64_t step = committed ? *manifest->step : 0;
    if (found && (!committed || (replace_through_step && step <= *replace_through_step))) {
      continue;  // nothing committed there (or nothing the caller keeps): as good as new
    }
    const std::string run = RunName(found ? manifest->run_id : m.run_id);
    const std::string what = paths[i] + " holds " + FolderOf(m) + " of the swap store of " + run;
    if (!found) {
      return Status::InvalidArgument(
                 "swap folder " + what + ", whose folder 0 (" + first +
                 " when the store was made) is not there now, so its committed step is "
                 "unknown: a fresh run there could destroy it. Give the store's folders to "
                 "resume it, or empty folders (remove the strata.* files of " +
                 paths[i] + " if that store is no longer wanted)")
          .WithPath(paths[i]);
    }
    return Status::InvalidArgument(
               "swap folder " + what + ", committed at step " + std::to_string(step) +
               " (its folder 0 is " + first +
               "): a fresh run there would destroy it. Resume that run with --resume " + first +
               " and its folders in order (" + OrderHint(m, paths, ms) + "), or give empty folders")
        .WithPath(paths[i]);
  }
  return Status::OK();
}

}  // namespace strata::swap_internal
