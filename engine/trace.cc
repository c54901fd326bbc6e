#include "engine/trace.h"

#include <algorithm>
#include <cerrno>
#include <iterator>

#include "strata/atomic_file.h"

namespace strata::engine_internal {

const char* TraceLaneName(TraceLane lane) {
  if (int(lane) < kNumResources) return ResourceName(Resource(lane));
  return lane == TraceLane::kStall ? "stall" : "step";
}

namespace {
void AppendJsonString(std::string* out, std::string_view s);
}  // namespace

Timeline::Timeline() : origin_(Clock::now()) {}

Timeline::~Timeline() { (void)CloseTrace(); }

Status Timeline::OpenTrace(const std::string& path, const std::string& process_name, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto out = AtomicFile::Create(path);
  if (!out.ok()) return out.status();
  out_ = std::move(*out);
  file_ = out_->stream();
  path_ = path;
  pid_ = pid;
  std::string head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  head += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
          ",\"tid\":0,\"args\":{\"name\":";
  AppendJsonString(&head, process_name);
  head += "}}";
  std::fputs(head.c_str(), file_);
  first_event_ = false;
  return Status::OK();
}

void Timeline::SetTraceRecording(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = on;
}

Status Timeline::CloseTrace() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return Status::OK();
  std::fputs("\n]}\n", file_);
  file_ = nullptr;
  Status s = out_->Commit();
  out_.reset();
  if (!s.ok()) return s.Annotate("writing trace file " + path_);
  return Status::OK();
}

namespace {
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      *out += buf;
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}
}  // namespace

void Timeline::WriteEventLocked(TraceLane lane, std::string_view label, Clock::time_point start,
                                Clock::time_point end, uint64_t bytes) {
  auto& slots = slots_[int(lane)];
  size_t slot = 0;
  while (slot < slots.size() && slots[slot] > start) ++slot;
  const int tid = int(lane) * 64 + int(std::min<size_t>(slot, 63)) + 1;
  std::string line;
  if (slot == slots.size()) {
    slots.push_back(end);
    std::string name = TraceLaneName(lane);
    if (slot > 0) name += " #" + std::to_string(slot + 1);
    line += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
            ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":";
    AppendJsonString(&line, name);
    line += "}}";
    line += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
            ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"sort_index\":" + std::to_string(tid) +
            "}}";
  } else {
    slots[slot] = end;
  }
  const double ts = std::chrono::duration<double, std::micro>(start - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - start).count();
  char buf[160];
  std::snprintf(buf, sizeof buf, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,",
                pid_, tid, ts, std::max(0.0, dur));
  line += buf;
  line += "\"name\":";
  AppendJsonString(&line, label);
  if (bytes) line += ",\"args\":{\"bytes\":" + std::to_string(bytes) + "}";
  line += "}";
  std::fwrite(line.data(), 1, line.size(), file_);
}

void Timeline::Add(TraceLane lane, std::string_view label, Clock::time_point start,
                   Clock::time_point end, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  intervals_[int(lane)].push_back({start, end});
  bytes_[int(lane)] += bytes;
  if (file_ && recording_) WriteEventLocked(lane, label, start, end, bytes);
}

void Timeline::BeginStep(Clock::time_point start) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& v : intervals_) {
    // Keep intervals still running across the boundary.
    std::erase_if(v, [&](const Interval& i) { return i.end < start; });
  }
  std::fill(std::begin(bytes_), std::end(bytes_), 0);
}

void Timeline::StepUsage(Clock::time_point from, Clock::time_point to, StepStats* st) const {
  for (int r = 0; r < kNumResources; ++r) {
    st->busy_seconds[r] = BusySeconds(LaneOf(Resource(r)), from, to);
    if (st->busy_seconds[r] > st->bound_seconds) {
      st->bound_seconds = st->busy_seconds[r];
      st->bound_resource = ResourceName(Resource(r));
    }
  }
  st->nvme_busy_seconds = BusySeconds2(TraceLane::kNvmeRead, TraceLane::kNvmeWrite, from, to);
  if (st->nvme_busy_seconds > st->bound_seconds) {
    st->bound_seconds = st->nvme_busy_seconds;
    st->bound_resource = "nvme";
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto of = [&](Resource r) { return bytes_[int(r)]; };
  st->bytes = EdgeBytes{of(Resource::kNvmeRead), of(Resource::kNvmeWrite), of(Resource::kH2D),
                        of(Resource::kD2H), of(Resource::kComm)};
}

std::vector<Timeline::Interval> Timeline::MergedLocked(TraceLane lane, Clock::time_point from,
                                                       Clock::time_point to) const {
  std::vector<Interval> v;
  for (const Interval& i : intervals_[int(lane)]) {
    Interval c{std::max(i.start, from), std::min(i.end, to)};
    if (c.end > c.start) v.push_back(c);
  }
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> merged;
  for (const Interval& i : v) {
    if (!merged.empty() && i.start <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, i.end);
    } else {
      merged.push_back(i);
    }
  }
  return merged;
}

double Timeline::BusySeconds(TraceLane lane, Clock::time_point from, Clock::time_point to) const {
  std::lock_guard<std::mutex> lock(mu_);
  double s = 0;
  for (const Interval& i : MergedLocked(lane, from, to)) {
    s += std::chrono::duration<double>(i.end - i.start).count();
  }
  return s;
}

double Timeline::BusySeconds2(TraceLane a, TraceLane b, Clock::time_point from,
                              Clock::time_point to) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Interval> v = MergedLocked(a, from, to);
  for (const Interval& i : MergedLocked(b, from, to)) v.push_back(i);
  std::sort(v.begin(), v.end(),
            [](const Interval& x, const Interval& y) { return x.start < y.start; });
  double s = 0;
  Clock::time_point start{}, end{};
  bool open = false;
  for (const Interval& i : v) {
    if (open && i.start <= end) {
      end = std::max(end, i.end);
      continue;
    }
    if (open) s += std::chrono::duration<double>(end - start).count();
    start = i.start;
    end = i.end;
    open = true;
  }
  if (open) s += std::chrono::duration<double>(end - start).count();
  return s;
}

double Timeline::ComputeIdleSeconds(Clock::time_point from, Clock::time_point to,
                                    Clock::time_point* last_compute_end) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto merged = MergedLocked(TraceLane::kCompute, from, to);
  if (merged.empty()) {
    *last_compute_end = from;
    return 0;
  }
  *last_compute_end = merged.back().end;
  double busy = 0;
  for (const Interval& i : merged) busy += std::chrono::duration<double>(i.end - i.start).count();
  return std::chrono::duration<double>(merged.back().end - from).count() - busy;
}

void Timeline::AddStallEvents(Clock::time_point from, Clock::time_point to) {
  std::lock_guard<std::mutex> lock(mu_);
  auto merged = MergedLocked(TraceLane::kCompute, from, to);
  Clock::time_point t = from;
  for (const Interval& i : merged) {
    if (i.start > t) {
      intervals_[int(TraceLane::kStall)].push_back({t, i.start});
      if (file_ && recording_) WriteEventLocked(TraceLane::kStall, "stall", t, i.start, 0);
    }
    t = i.end;
  }
}

}  // namespace strata::engine_internal
