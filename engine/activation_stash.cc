#include "engine/activation_stash.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <filesystem>
#include <map>

#include "engine/fault_env.h"
#include "io/swap_store.h"
#include "strata/bytes.h"
#include "strata/log.h"

namespace strata::engine_internal {

namespace {

std::string ActName(uint32_t key) { return "activation " + std::to_string(key); }

}  // namespace

ActivationStash::~ActivationStash() {
  Shutdown();
  for (ScratchFile& f : files_) {
    if (backend_ && f.file >= 0) (void)backend_->CloseFile(f.file);
  }
  backend_.reset();
  for (ScratchFile& f : files_) {
    if (f.lock_fd < 0) continue;
    // Only a file this engine locked is removed (another engine's is never touched).
    if (unlink(f.path.c_str()) != 0 && errno != ENOENT) {
      LogWarning("removing the activation scratch file " + f.path + ": " + std::strerror(errno));
    }
    close(f.lock_fd);
  }
}

void ActivationStash::Shutdown() {
  {
    MutexLock lock(&mu_);
    shutdown_ = true;
    cv_.SignalAll();
  }
  if (io_thread_.joinable()) io_thread_.join();
}

// Runs before any thread starts.
Status ActivationStash::Init() NO_THREAD_SAFETY_ANALYSIS {
  const PlacementReport& rep = ctx_.place.report;
  count_ = rep.activation_count;
  if (count_ == 0) {
    RemoveLeftoverScratchFiles();
    return Status::OK();
  }
  max_bytes_ = ctx_.opt.activation_bytes;
  slot_bytes_ = rep.activation_slot_bytes;
  for (int s = 0; s < rep.activation_host_slots; ++s) {
    STRATA_ASSIGN_OR_RETURN(void* p,
                            host_.Allocate(slot_bytes_, "activation slot " + std::to_string(s)));
    slot_buf_.push_back(static_cast<char*>(p));
  }
  for (int s = int(slot_buf_.size()) - 1; s >= 0; --s) free_slots_.push_back(s);
  slot_busy_.assign(slot_buf_.size(), nullptr);
  spill_ = rep.activation_host_slots < count_;
  if (spill_) {
    for (int n = count_ - 1; n >= 0; --n) free_nvme_.push_back(n);
    STRATA_RETURN_IF_ERROR(OpenScratchFiles());
  }
  RemoveLeftoverScratchFiles();  // after ours are locked: those are skipped
  STRATA_ASSIGN_OR_RETURN(ctx_.place.report.activation_nvme_capacity, NvmeCapacity());
  if (spill_) {
    kill_hook_ = KillHookFromEnvironment();
    io_thread_ = std::thread([this] { IoLoop(); });
  }
  return Status::OK();
}

// Runs before any thread starts. A scratch file of this rank that no engine holds (its flock
// died with a killed process) is a leftover: this engine's own are locked by now, and one
// named for another folder count, or in a run that does not spill, would otherwise stay on
// the disk for good. Only plain files are removed (not links, FIFOs or devices), under the
// lock, so an engine opening one meanwhile keeps a file of its own.
void ActivationStash::RemoveLeftoverScratchFiles() const {
  const std::string prefix = "strata.activations.rank" + std::to_string(ctx_.rank) + ".";
  for (const std::string& folder : ctx_.opt.nvme_paths) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string path = entry.path().string();
      const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat st {};
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 &&
          flock(fd, LOCK_EX | LOCK_NB) == 0) {
        if (unlink(path.c_str()) == 0) {
          LogWarning("removed the activation scratch file " + path +
                     " left by a run that did not close (killed?); nothing in it was needed");
        }
      }
      close(fd);
    }
  }
}

// Runs before any thread starts. Each file holds ceil(count / n) slots, so the folders admit
// n times the fewest slots a folder's share of its file system's free space holds (folders
// on one file system share it).
Result<int64_t> ActivationStash::NvmeCapacity() const NO_THREAD_SAFETY_ANALYSIS {
  const std::vector<std::string>& folders = ctx_.opt.nvme_paths;
  if (folders.empty()) return int64_t(0);
  struct FileSystem {
    uint64_t free = 0;  // f_bavail, plus what this stash's files there take
    int folders = 0;
  };
  std::map<dev_t, FileSystem> by_fs;
  std::vector<dev_t> dev_of;
  for (size_t i = 0; i < folders.size(); ++i) {
    struct stat st {};
    struct statvfs vfs {};
    if (stat(folders[i].c_str(), &st) != 0 || statvfs(folders[i].c_str(), &vfs) != 0) {
      const int err = errno;
      return Status::FromErrno(err, "statvfs " + folders[i]).WithPath(folders[i]);
    }
    FileSystem& fs = by_fs[st.st_dev];
    fs.free = uint64_t(vfs.f_bavail) * vfs.f_frsize;
    fs.folders++;
    dev_of.push_back(st.st_dev);
  }
  for (size_t i = 0; i < files_.size() && i < dev_of.size(); ++i) {
    struct stat st {};
    if (fstat(files_[i].lock_fd, &st) == 0) by_fs[dev_of[i]].free += uint64_t(st.st_blocks) * 512;
  }
  uint64_t per_file = UINT64_MAX;
  for (const auto& [dev, fs] : by_fs) {
    per_file = std::min(per_file, fs.free / uint64_t(fs.folders) / slot_bytes_);
  }
  return int64_t(std::min<uint64_t>(per_file, INT64_MAX / folders.size()) * folders.size());
}

// Runs before any thread starts.
Status ActivationStash::OpenScratchFiles() NO_THREAD_SAFETY_ANALYSIS {
  const EngineOptions& opt = ctx_.opt;
  if (opt.nvme_paths.empty()) {
    return Status::InvalidArgument(
        "the activation placement needs NVMe but no NVMe paths were "
        "given");
  }
  STRATA_ASSIGN_OR_RETURN(const IoBackendFactory factory,
                          FaultsFromEnvironment(opt.io_backend_factory));
  if (factory) {
    STRATA_ASSIGN_OR_RETURN(backend_, factory(opt.io));
    if (!backend_) {
      return Status::InvalidArgument("EngineOptions::io_backend_factory returned no backend");
    }
  } else {
    STRATA_ASSIGN_OR_RETURN(backend_, CreateIoBackend(opt.io));
  }
  const int n = int(opt.nvme_paths.size());
  const uint64_t per_file = uint64_t((count_ + n - 1) / n) * slot_bytes_;
  for (int i = 0; i < n; ++i) {
    const std::string& folder = opt.nvme_paths[i];
    ScratchFile f;
    f.path =
        swap_internal::JoinPath(folder, "strata.activations.rank" + std::to_string(ctx_.rank) +
                                            "." + std::to_string(i) + "-of-" + std::to_string(n));
    const int fd = open(f.path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      return Status::FromErrno(errno, "creating the activation scratch file " + f.path)
          .WithPath(f.path);
    }
    // A file left by a crashed run is taken over (nothing in it is needed), but only a plain
    // one: a FIFO, a device or a hard link planted under the name is refused and left alone.
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
      close(fd);
      return Status::InvalidArgument("refusing the activation scratch file " + f.path +
                                     ": it is not a plain regular file (a link, FIFO or device "
                                     "under that name); remove it")
          .WithPath(f.path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      close(fd);
      return Status::InvalidArgument("the activation scratch file " + f.path +
                                     " is in use by another engine (a rank of the same number "
                                     "in the same folder?); give each engine its own --nvme "
                                     "folder")
          .WithPath(f.path)
          .WithErrno(err);
    }
    (void)fchmod(fd, 0600);  // one left by an older run keeps no wider mode
    f.lock_fd = fd;
    files_.push_back(f);  // removed at close from here on
    OpenOptions oo;
    oo.create = true;
    oo.direct = opt.io.direct;
    oo.no_follow = true;
    oo.mode = 0600;
    STRATA_ASSIGN_OR_RETURN(files_.back().file, backend_->OpenFile(f.path, oo));
    Status s = backend_->Allocate(files_.back().file, per_file);
    if (!s.ok()) {
      const std::string what = "the activation stash needs " + FormatBytesExact(per_file) +
                               " of scratch space in folder " + folder + " (" +
                               std::to_string(count_) + " activations of " +
                               FormatBytes(slot_bytes_) + " over " + std::to_string(n) +
                               (n == 1 ? " folder" : " folders") + ", in " + f.path +
                               "); free space there, give another --nvme folder, or more "
                               "--host-mem for the activations";
      return (s.code() == StatusCode::kNoSpace ? Status::OutOfMemory(what + ": " + s.message())
                                               : Status(s).Annotate(what))
          .WithPath(f.path);
    }
  }
  const BufferRegion region = host_.PoolRegion();
  return backend_->RegisterBuffers(std::span<const BufferRegion>(&region, 1));
}

// ---------------------------------------------------------------------------------------
// The model's calls
// ---------------------------------------------------------------------------------------

void ActivationStash::BeginStep() {
  MutexLock lock(&mu_);
  step_open_ = true;
  record_.clear();
  on_track_ = !learned_.empty();
  cursor_ = 0;
  step_bytes_ = EdgeBytes{};
  fetch_waits_ = 0;
  cv_.SignalAll();
}

void ActivationStash::TrackLocked(const Op& op) {
  record_.push_back(op);
  if (!on_track_) return;
  if (cursor_ < int64_t(learned_.size()) && learned_[cursor_] == op) {
    ++cursor_;
  } else {
    on_track_ = false;  // no prefetch for the rest of the step; EndStep relearns
  }
}

Result<EventPtr> ActivationStash::Stash(uint32_t key, const void* device_src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(ctx_.Error());
  Device& dev = *ctx_.dev;
  MutexLock lock(&mu_);
  if (count_ == 0) {
    return Status::InvalidArgument(
        "StashActivation: the engine was created without activations "
        "(EngineOptions::activation_bytes and activation_count)");
  }
  if (!step_open_) return Status::InvalidArgument("StashActivation outside a step");
  if (bytes == 0 || bytes > max_bytes_) {
    return Status::InvalidArgument("StashActivation: " + ActName(key) + " of " +
                                   std::to_string(bytes) + " bytes; it must be 1.." +
                                   std::to_string(max_bytes_) + " (activation_bytes)");
  }
  // A key fetched with last=true while its spill or read-back was in flight stays until that
  // job ends (FinishJobLocked drops it), and so do its slots: a model that stashes the key
  // again at once (the residual gradient, every block of backward) waits for it, as does one
  // that needs the slots of such keys. Before, that was refused as "live already".
  auto lingering = [&]() REQUIRES(mu_) {
    auto it = live_.find(key);
    if (it != live_.end()) return it->second.dead;
    if (int(live_.size()) < count_) return false;
    return std::any_of(live_.begin(), live_.end(), [](const auto& kv) { return kv.second.dead; });
  };
  while (error_.ok() && !shutdown_ && lingering()) {
    cv_.SignalAll();
    cv_.Wait();
  }
  STRATA_RETURN_IF_ERROR(error_);
  if (shutdown_) return Status::Aborted("engine is shutting down");
  if (live_.count(key)) {
    return Status::InvalidArgument("StashActivation: " + ActName(key) +
                                   " is live already (fetch it with last=true first)");
  }
  if (int(live_.size()) >= count_) {
    return Status::OutOfMemory(
        "StashActivation: " + ActName(key) + " would make " + std::to_string(live_.size() + 1) +
        " activations live, more than activation_count " + std::to_string(count_));
  }
  TrackLocked(Op{false, key, false});
  // A landing slot: the I/O thread frees one by spilling when none is.
  landing_wanted_ = true;
  while (error_.ok() && !shutdown_ && free_slots_.empty()) {
    cv_.SignalAll();
    cv_.Wait();
  }
  landing_wanted_ = false;
  STRATA_RETURN_IF_ERROR(error_);
  if (shutdown_) return Status::Aborted("engine is shutting down");
  const int s = free_slots_.back();
  // The copy reads what the compute lane wrote, into a slot whose last copy is done.
  Status st;
  auto computed = dev.Record(Lane::kCompute);
  st = computed.status();
  if (st.ok()) st = dev.WaitEvent(Lane::kD2H, *computed);
  if (st.ok() && slot_busy_[s]) st = dev.WaitEvent(Lane::kD2H, slot_busy_[s]);
  const std::string label = "act " + std::to_string(key) + " stash";
  if (st.ok()) st = dev.CopyToHost(slot_buf_[s], device_src, bytes, label, Lane::kD2H);
  Result<EventPtr> landed = st.ok() ? dev.Record(Lane::kD2H) : Result<EventPtr>(st);
  if (!landed.ok()) {
    record_.pop_back();
    return landed.status();
  }
  free_slots_.pop_back();
  Act a;
  a.bytes = bytes;
  a.seq = ++seq_;
  a.slot = s;
  a.host_ready = true;
  a.landed = *landed;
  slot_busy_[s] = *landed;
  live_.emplace(key, std::move(a));
  step_bytes_.d2h += bytes;
  cv_.SignalAll();  // the I/O thread may spill now
  return *landed;
}

Status ActivationStash::Fetch(uint32_t key, void* device_dst, bool last) {
  STRATA_RETURN_IF_ERROR(ctx_.Error());
  Device& dev = *ctx_.dev;
  MutexLock lock(&mu_);
  if (!step_open_) return Status::InvalidArgument("FetchActivation outside a step");
  auto it = live_.find(key);
  if (it == live_.end()) {
    return Status::InvalidArgument("FetchActivation: " + ActName(key) +
                                   " is not live (not stashed this step, or fetched with "
                                   "last=true already)");
  }
  TrackLocked(Op{true, key, last});
  Act& a = it->second;  // references into live_ survive rehashing
  if (!a.host_ready) {
    ++fetch_waits_;
    wanted_ = key;
    cv_.SignalAll();
    while (error_.ok() && !shutdown_ && !a.host_ready) cv_.Wait();
    wanted_.reset();
    STRATA_RETURN_IF_ERROR(error_);
    if (shutdown_) return Status::Aborted("engine is shutting down");
  }
  // After the compute work before (which may still use device_dst) and the landing.
  Status st;
  auto computed = dev.Record(Lane::kCompute);
  st = computed.status();
  if (st.ok()) st = dev.WaitEvent(Lane::kH2D, *computed);
  if (st.ok() && a.landed) st = dev.WaitEvent(Lane::kH2D, a.landed);
  const std::string label = "act " + std::to_string(key) + " fetch";
  if (st.ok()) st = dev.CopyToDevice(device_dst, slot_buf_[a.slot], a.bytes, label, Lane::kH2D);
  Result<EventPtr> copied = st.ok() ? dev.Record(Lane::kH2D) : Result<EventPtr>(st);
  if (copied.ok()) st = dev.WaitEvent(Lane::kCompute, *copied);
  STRATA_RETURN_IF_ERROR(st);
  slot_busy_[a.slot] = *copied;
  step_bytes_.h2d += a.bytes;
  if (last) DropLocked(key);
  cv_.SignalAll();
  return Status::OK();
}

void ActivationStash::DropLocked(uint32_t key) {
  auto it = live_.find(key);
  Act& a = it->second;
  if (a.writing || a.reading) {
    a.dead = true;  // FinishJobLocked drops it
    return;
  }
  if (a.slot >= 0) free_slots_.push_back(a.slot);
  if (a.nvme >= 0) free_nvme_.push_back(a.nvme);
  live_.erase(it);
}

Status ActivationStash::EndStep() {
  MutexLock lock(&mu_);
  if (!step_open_) return Status::OK();
  while (io_busy_) cv_.Wait();
  step_open_ = false;  // PickJobLocked starts nothing more
  std::vector<uint32_t> keys;
  for (const auto& [key, a] : live_) keys.push_back(key);
  for (uint32_t key : keys) DropLocked(key);
  // A step that departed from the learned sequence (or ended early) is the one to learn.
  if (error_.ok() && !(on_track_ && cursor_ == int64_t(learned_.size()))) {
    learned_ = std::move(record_);
    fetch_pos_.clear();
    last_stash_pos_ = -1;
    for (int64_t i = 0; i < int64_t(learned_.size()); ++i) {
      if (learned_[i].fetch) {
        fetch_pos_[learned_[i].key].push_back(i);
      } else {
        last_stash_pos_ = i;
      }
    }
  }
  record_.clear();
  cv_.SignalAll();
  return error_;
}

void ActivationStash::AddStats(StepStats* st) const {
  MutexLock lock(&mu_);
  st->activation_bytes = step_bytes_;
  st->activation_fetch_waits = fetch_waits_;
  st->peak_host_bytes += uint64_t(slot_buf_.size()) * slot_bytes_;
}

// ---------------------------------------------------------------------------------------
// The I/O thread
// ---------------------------------------------------------------------------------------

int ActivationStash::ReserveLocked() const {
  if (!on_track_) return 1;
  return cursor_ <= last_stash_pos_ ? 1 : 0;  // a Stash is still ahead
}

int64_t ActivationStash::NextUseLocked(uint32_t key) const {
  auto it = fetch_pos_.find(key);
  if (it == fetch_pos_.end()) return INT64_MAX;
  auto pos = std::lower_bound(it->second.begin(), it->second.end(), cursor_);
  return pos == it->second.end() ? INT64_MAX : *pos;
}

ActivationStash::Job ActivationStash::ReadJobLocked(uint32_t key, Act& a) {
  const int s = free_slots_.back();
  free_slots_.pop_back();
  a.slot = s;
  a.reading = true;
  return Job{false, key, s, a.nvme, a.bytes, a.checksum, slot_busy_[s]};
}

std::optional<ActivationStash::Job> ActivationStash::EvictLocked(int64_t sooner, bool* dropped) {
  *dropped = false;
  uint32_t victim = 0;
  const Act* best = nullptr;
  int64_t best_use = -1;
  for (const auto& [key, a] : live_) {
    if (a.slot < 0 || !a.host_ready || a.writing || a.reading || a.dead) continue;
    if (wanted_ && key == *wanted_) continue;  // read back for the Fetch waiting for it
    if (on_track_) {
      const int64_t use = NextUseLocked(key);
      if (use <= sooner || use <= best_use) continue;
      best_use = use;
    } else if (best && a.seq >= best->seq) {
      continue;
    }
    best = &a;
    victim = key;
  }
  if (!best) return std::nullopt;
  Act& a = live_.at(victim);
  if (a.nvme >= 0) {  // its NVMe copy is valid: dropping the host copy costs nothing
    free_slots_.push_back(a.slot);
    a.slot = -1;
    a.host_ready = false;
    *dropped = true;
    cv_.SignalAll();  // a Stash may be waiting for this slot (the I/O thread then sleeps)
    return std::nullopt;
  }
  a.writing = true;
  a.nvme = free_nvme_.back();
  free_nvme_.pop_back();
  return Job{true, victim, a.slot, a.nvme, a.bytes, 0, a.landed};
}

std::optional<ActivationStash::Job> ActivationStash::PickJobLocked() {
  if (!error_.ok() || !step_open_ || !spill_) return std::nullopt;
  for (;;) {
    bool dropped = false;
    // 1. A Fetch waiting for a key on NVMe.
    if (wanted_) {
      Act& a = live_.at(*wanted_);
      if (!a.host_ready && !a.reading) {
        if (!free_slots_.empty()) return ReadJobLocked(*wanted_, a);
        auto job = EvictLocked(-1, &dropped);
        if (job || dropped) {
          if (job) return job;
          continue;
        }
      }
    }
    // 2. A free slot for the next landing; the Stash waiting for one takes the next freed.
    if (landing_wanted_) {
      if (!free_slots_.empty()) return std::nullopt;
      auto job = EvictLocked(-1, &dropped);
      if (job) return job;
      if (dropped) continue;
      return std::nullopt;
    }
    if (int(free_slots_.size()) < ReserveLocked()) {
      auto job = EvictLocked(-1, &dropped);
      if (job) return job;
      if (dropped) continue;
    }
    // 3. Prefetch: the key on NVMe fetched soonest, into a free slot or in place of a key
    // fetched later.
    if (!on_track_) return std::nullopt;
    uint32_t next = 0;
    int64_t next_use = INT64_MAX;
    for (const auto& [key, a] : live_) {
      if (a.slot >= 0 || a.reading || a.nvme < 0 || a.dead) continue;
      const int64_t use = NextUseLocked(key);
      if (use < next_use) next_use = use, next = key;
    }
    if (next_use == INT64_MAX) return std::nullopt;
    if (int(free_slots_.size()) > ReserveLocked()) return ReadJobLocked(next, live_.at(next));
    auto job = EvictLocked(next_use, &dropped);
    if (job) return job;
    if (!dropped) return std::nullopt;
  }
}

Status ActivationStash::RunJob(Job* job) {
  if (job->wait) {
    Status s = job->wait->Synchronize();
    if (!s.ok())
      return s.Annotate(ActName(job->key) + ": the device copy before its NVMe " +
                        (job->write ? "write" : "read"));
  }
  char* buf = slot_buf_[job->slot];
  const auto [f, offset] = Where(job->nvme);
  const ScratchFile& file = files_[f];
  const uint64_t length = RoundUp(job->bytes, kIoAlignment);
  if (job->write) job->checksum = swap_internal::Checksum64(buf, job->bytes);
  const IoRequest req{job->write ? IoOp::kWrite : IoOp::kRead, file.file, offset, buf, length, 0};
  const Clock::time_point t0 = Clock::now();
  Status s = backend_->Submit(std::span<const IoRequest>(&req, 1));
  if (kill_hook_ && s.ok()) {
    kill_hook_(job->write ? "activation_write_submitted" : "activation_read_submitted");
  }
  IoCompletion done;
  while (s.ok()) {
    auto n = backend_->Poll(std::span<IoCompletion>(&done, 1), 1);
    if (!n.ok()) s = n.status();
    if (!n.ok() || *n == 1) break;
  }
  if (s.ok()) s = done.status;
  const std::string what = ActName(job->key) + (job->write ? ": writing " : ": reading ") +
                           FormatBytes(length) + " of " + file.path + " at offset " +
                           std::to_string(offset);
  if (!s.ok()) {
    Status out = Status(s).Annotate(what);
    if (out.path().empty()) out.WithPath(file.path);
    return out.WithOffset(offset);
  }
  ctx_.timeline.Add(job->write ? TraceLane::kNvmeWrite : TraceLane::kNvmeRead,
                    "act " + std::to_string(job->key) + (job->write ? " write" : " read"), t0,
                    Clock::now(), length);
  if (!job->write && swap_internal::Checksum64(buf, job->bytes) != job->checksum) {
    return Status::Corruption(what +
                              ": checksum mismatch (the scratch file's data is damaged; "
                              "the drive or the file system returned wrong bytes)")
        .WithPath(file.path)
        .WithOffset(offset);
  }
  return Status::OK();
}

void ActivationStash::FailLocked(const Status& s) {
  if (error_.ok()) error_ = s;
  cv_.SignalAll();
}

void ActivationStash::FinishJobLocked(const Job& job, Status s) {
  Act& a = live_.at(job.key);
  const uint64_t length = RoundUp(job.bytes, kIoAlignment);
  if (job.write) {
    a.writing = false;
    if (s.ok()) {
      a.checksum = job.checksum;
      a.landed = nullptr;
      step_bytes_.nvme_write += length;
      free_slots_.push_back(a.slot);  // spilled: the slot is free (its copies finish first)
      a.slot = -1;
      a.host_ready = false;
    } else {
      free_nvme_.push_back(a.nvme);
      a.nvme = -1;
    }
  } else {
    a.reading = false;
    if (s.ok()) {
      a.host_ready = true;
      a.landed = nullptr;
      step_bytes_.nvme_read += length;
    } else {
      free_slots_.push_back(a.slot);
      a.slot = -1;
    }
  }
  if (a.dead) DropLocked(job.key);
  if (!s.ok()) FailLocked(s);
}

void ActivationStash::IoLoop() {
  MutexLock lock(&mu_);
  for (;;) {
    std::optional<Job> job;
    while (!shutdown_ && !(job = PickJobLocked())) cv_.Wait();
    if (shutdown_) return;
    io_busy_ = true;
    mu_.Unlock();
    Status s = RunJob(&*job);
    mu_.Lock();
    io_busy_ = false;
    FinishJobLocked(*job, s);
    cv_.SignalAll();
    if (!s.ok()) {
      mu_.Unlock();
      ctx_.SetWorkerError(s);  // never under mu_ (the engine takes mu_ under its own)
      mu_.Lock();
    }
  }
}

}  // namespace strata::engine_internal
