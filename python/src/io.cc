// strata.io's core: IoHandle (reads and writes of raw memory against files, through one
// IoBackend: io_uring, else posix), AlignedBuffer (page-aligned host memory, so that
// transfers from it can use O_DIRECT) and AtomicFile (include/strata/atomic_file.h: the
// CLI's writer of output files, for strata.save_safetensors).
//
// A request is split into block_size pieces, all submitted at once (the backend queues what
// exceeds its queue depth). A file is opened with O_DIRECT when the address, offset and
// length are all 4 KiB aligned, buffered otherwise, and closed when its request completes.
// Thread safety: the backend serves one submitting thread at a time, so every call holds the
// handle's mutex while it touches the backend; waits poll with the GIL released.
#include "strata/io.h"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "python/src/binding.h"
#include "strata/atomic_file.h"

namespace py = pybind11;

namespace strata::python {
namespace {

class IoHandle {
 public:
  IoHandle(uint64_t block_size, uint32_t queue_depth, const std::string& backend) {
    if (block_size == 0 || block_size % kIoAlignment != 0) {
      ThrowIfError(Status::InvalidArgument("block_size " + std::to_string(block_size) +
                                           " must be a positive multiple of 4096 bytes"));
    }
    block_size_ = block_size;
    Result<IoBackendKind> kind = ParseIoBackendKind(backend);
    ThrowIfError(kind.status());
    IoBackendOptions options;
    options.kind = *kind;
    options.queue_depth = queue_depth;
    Result<std::unique_ptr<IoBackend>> b = CreateIoBackend(options);
    ThrowIfError(b.status());
    backend_ = std::move(*b);
  }

  ~IoHandle() {
    // Nothing may still write into memory Python is about to free.
    std::lock_guard<std::mutex> lock(mu_);
    while (backend_->InFlight() > 0) {
      if (!PollLocked().ok()) break;
    }
    for (auto& [id, r] : requests_) (void)backend_->CloseFile(r.file);
  }

  std::string Name() const { return std::string(backend_->Name()); }

  // Queues a transfer of `bytes` at `address` against `path` at `offset`; returns its id.
  uint64_t Submit(IoOp op, uintptr_t address, uint64_t bytes, const std::string& path,
                  uint64_t offset) {
    CheckPathArgument(path, "path");
    py::gil_scoped_release release;  // before the mutex: a waiter holds it without the GIL
    std::lock_guard<std::mutex> lock(mu_);
    const bool aligned =
        address % kIoAlignment == 0 && offset % kIoAlignment == 0 && bytes % kIoAlignment == 0;
    OpenOptions open;
    open.create = op == IoOp::kWrite;
    open.read_only = op == IoOp::kRead;
    open.direct = aligned;
    Result<int> file = backend_->OpenFile(path, open);
    ThrowIfError(file.status());
    const uint64_t id = next_id_++;
    std::vector<IoRequest> pieces;
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min(block_size_, bytes - done);
      pieces.push_back({.op = op,
                        .file = *file,
                        .offset = offset + done,
                        .buffer = reinterpret_cast<char*>(address) + done,
                        .length = n,
                        .user_data = id});
      done += n;
    }
    Pending& p = requests_[id];
    p.file = *file;
    p.remaining = pieces.size();
    if (pieces.empty()) return id;  // zero bytes: complete at once
    Status s = backend_->Submit(pieces);
    if (!s.ok()) {
      requests_.erase(id);
      (void)backend_->CloseFile(*file);
      ThrowIfError(s.Annotate(std::string(op == IoOp::kRead ? "reading " : "writing ") + path));
    }
    return id;
  }

  // Waits for request `id`; raises its first failure.
  void Wait(uint64_t id) {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) {
      ThrowIfError(Status::InvalidArgument("request " + std::to_string(id) +
                                           " is unknown or was already waited for"));
    }
    while (it->second.remaining > 0) ThrowIfError(PollLocked());
    Status result = it->second.status;
    (void)backend_->CloseFile(it->second.file);
    requests_.erase(it);
    ThrowIfError(result);
  }

  // Waits for every request; returns how many there were; raises the first failure.
  size_t WaitAll() {
    std::vector<uint64_t> ids;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, r] : requests_) ids.push_back(id);
    }
    Status first;
    for (uint64_t id : ids) {
      try {
        Wait(id);
      } catch (const StrataError& e) {
        if (first.ok()) first = Status::IOError(e.what());
      }
    }
    if (!first.ok()) throw StrataError(first.message());
    return ids.size();
  }

 private:
  struct Pending {
    int file = -1;
    size_t remaining = 0;
    Status status;  // the first failed piece
  };

  // Collects at least one completion (REQUIRES mu_ held, something in flight).
  Status PollLocked() {
    IoCompletion done[64];
    Result<size_t> n = backend_->Poll(done, 1);
    if (!n.ok()) return n.status();
    for (size_t i = 0; i < *n; ++i) {
      auto it = requests_.find(done[i].user_data);
      if (it == requests_.end()) continue;
      --it->second.remaining;
      if (!done[i].status.ok() && it->second.status.ok()) it->second.status = done[i].status;
    }
    return Status::OK();
  }

  uint64_t block_size_ = 0;
  std::unique_ptr<IoBackend> backend_;
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> requests_;
};

// Page-aligned, zeroed host memory exposed through the buffer protocol (torch.frombuffer keeps
// this object alive as long as the tensor).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : bytes_(bytes) {
    const size_t rounded = std::max<size_t>(kIoAlignment, (bytes + 4095) / 4096 * 4096);
    data_ = std::aligned_alloc(kIoAlignment, rounded);
    if (data_ == nullptr) {
      ThrowIfError(Status::OutOfMemory("cannot allocate " + std::to_string(bytes) +
                                       " bytes of aligned host memory"));
    }
    std::memset(data_, 0, rounded);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_;
};

// An AtomicFile for Python: the bytes are streamed to the temporary file (so a large model is
// never held twice in memory) and land at the path only at commit(); discard() (or the object's
// end) removes the temporary and leaves the path as it was.
class PyAtomicFile {
 public:
  explicit PyAtomicFile(const std::string& path) {
    CheckPathArgument(path, "path");
    Result<std::unique_ptr<AtomicFile>> f = AtomicFile::Create(path);
    ThrowIfError(f.status());
    file_ = std::move(*f);
  }

  void Write(std::string_view bytes) {
    py::gil_scoped_release release;
    ThrowIfError(Open().Write(bytes));
  }
  // Writes `bytes` bytes of host memory at `address` (a tensor's data_ptr()).
  void WriteFrom(uintptr_t address, size_t bytes) {
    Write(std::string_view(reinterpret_cast<const char*>(address), bytes));
  }
  void Commit() {
    Status s;
    {
      py::gil_scoped_release release;
      s = Open().Commit();
    }
    file_.reset();
    ThrowIfError(s);
  }
  void Discard() { file_.reset(); }

 private:
  AtomicFile& Open() {
    if (!file_)
      ThrowIfError(Status::InvalidArgument("the file was already committed or discarded"));
    return *file_;
  }

  std::unique_ptr<AtomicFile> file_;
};

}  // namespace

void BindIo(py::module_& m) {
  py::class_<IoHandle>(m, "IoHandle")
      .def(py::init<uint64_t, uint32_t, const std::string&>(), py::arg("block_size"),
           py::arg("queue_depth"), py::arg("backend"))
      .def_property_readonly("backend", &IoHandle::Name)
      .def(
          "submit",
          [](IoHandle& h, bool write, uintptr_t address, uint64_t bytes, const std::string& path,
             uint64_t offset) {
            return h.Submit(write ? IoOp::kWrite : IoOp::kRead, address, bytes, path, offset);
          },
          py::arg("write"), py::arg("address"), py::arg("bytes"), py::arg("path"),
          py::arg("offset"))
      .def("wait", &IoHandle::Wait, py::arg("request"))
      .def("wait_all", &IoHandle::WaitAll);
  py::class_<AlignedBuffer>(m, "AlignedBuffer", py::buffer_protocol())
      .def(py::init<size_t>(), py::arg("bytes"))
      .def_property_readonly("address", [](const AlignedBuffer& b) { return uintptr_t(b.data()); })
      .def_buffer([](AlignedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {py::ssize_t{1}});
      });
  py::class_<PyAtomicFile>(m, "AtomicFile")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def("write", [](PyAtomicFile& f, const py::bytes& b) { f.Write(std::string_view(b)); })
      .def("write_from", &PyAtomicFile::WriteFrom, py::arg("address"), py::arg("bytes"))
      .def("commit", &PyAtomicFile::Commit)
      .def("discard", &PyAtomicFile::Discard);
}

}  // namespace strata::python
