// `strata bench comm`: the collectives the engine depends on (all-gather, reduce-scatter,
// all-reduce, broadcast), measured the way nccl-tests measures them, on Gloo and, where a GPU
// and a CUDA build are present, on NCCL. Run it under a launcher, one process per rank:
//   strata launch -n 4 --output rank0 -- strata bench comm --max-bytes 64M
//
// Per message size (--min-bytes to --max-bytes, times --factor) and collective: time per
// iteration, algbw = size / time, busbw = algbw * the nccl-tests factor ((n-1)/n for
// all-gather and reduce-scatter, 2(n-1)/n for all-reduce, 1 for broadcast), and #wrong. Size
// is nccl-tests' too: the whole buffer (all-gather: the gathered output; reduce-scatter: the
// whole input; all-reduce and broadcast: the buffer), fp32 elements, rounded down to a
// multiple of the rank count. Each iteration starts after a barrier, is timed alone, and its
// result is checked in full before the next (every element of every iteration: inputs are
// small integers that depend on the rank, the element and the iteration, so sums are exact
// and a stale or misplaced value is caught); time is the slowest rank's mean. The bound is
// the TCP bandwidth between rank 0 and rank 1 measured in the same run (a plain socket copy
// to the address rank 1's Gloo transport listens on), printed with busbw as a ratio.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/join.h"
#include "comm/messages.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/status.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/run_flags.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::vector<std::string> ops;       // empty: all four
  std::vector<std::string> backends;  // empty: auto
  std::string min_bytes = "8";
  std::string max_bytes = "64M";
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  std::string tcp_bytes = "256M";  // the socket copy that measures the bound; 0: none
  std::string rendezvous;
  double comm_timeout = 0;
  std::string run_secret, run_secret_file;  // --run-secret, --run-secret-file
  std::string json;
};

enum class Op { kAllGather, kReduceScatter, kAllReduce, kBroadcast };
constexpr Op kOps[] = {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce, Op::kBroadcast};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllGather:
      return "all-gather";
    case Op::kReduceScatter:
      return "reduce-scatter";
    case Op::kAllReduce:
      return "all-reduce";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "?";
}

// nccl-tests' bus bandwidth factor: what each rank moves per byte of the collective's size
// under a bandwidth-optimal algorithm.
double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllGather:
    case Op::kReduceScatter:
      return double(n - 1) / n;
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

// The value rank r contributes at element i in iteration k: a small integer, so that sums
// over up to 2^14 ranks are exact in fp32, different for every rank, element and iteration.
float Value(int r, size_t i, int k) {
  return float((i * 7 + size_t(r) * 131 + size_t(k) * 29) % 1021 + 1);
}

// One collective of `total` fp32 elements (nccl-tests' size) on `comm`, with host buffers in
// and out (copied to and from device memory when the communicator wants device buffers).
class Case {
 public:
  Case(Communicator& comm, Device* device, Op op, size_t total)
      : comm_(comm), device_(device), op_(op), n_(comm.world_size()), total_(total) {
    per_rank_ = total_ / size_t(n_);
  }
  ~Case() {
    if (device_ != nullptr) {
      if (dev_in_ != nullptr) (void)device_->Free(dev_in_);
      if (dev_out_ != nullptr) (void)device_->Free(dev_out_);
    }
  }

  size_t InputCount() const { return op_ == Op::kAllGather ? per_rank_ : total_; }
  size_t OutputCount() const { return op_ == Op::kReduceScatter ? per_rank_ : total_; }

  Status Allocate() {
    in_.resize(InputCount());
    out_.resize(OutputCount());
    if (device_ == nullptr) return Status::OK();
    STRATA_ASSIGN_OR_RETURN(dev_in_, device_->Allocate(InputCount() * 4));
    STRATA_ASSIGN_OR_RETURN(dev_out_, device_->Allocate(OutputCount() * 4));
    return Status::OK();
  }

  // Fills the input for iteration k and poisons the output (NaN: an element the collective
  // does not write is wrong).
  Status Prepare(int k) {
    const int r = comm_.rank();
    const size_t base = op_ == Op::kAllGather ? size_t(r) * per_rank_ : 0;
    for (size_t i = 0; i < in_.size(); ++i) in_[i] = Value(r, base + i, k);
    std::fill(out_.begin(), out_.end(), std::numeric_limits<float>::quiet_NaN());
    if (op_ == Op::kBroadcast) out_ = in_;  // in place: the root's buffer is the input
    if (device_ == nullptr) return Status::OK();
    STRATA_RETURN_IF_ERROR(device_->CopyToDevice(dev_in_, in_.data(), in_.size() * 4, "bench in"));
    STRATA_RETURN_IF_ERROR(
        device_->CopyToDevice(dev_out_, out_.data(), out_.size() * 4, "bench out"));
    return device_->SynchronizeLane(Lane::kH2D);
  }

  // Issues the collective of iteration k and waits for it.
  Status Run(int k) {
    void* in = device_ ? dev_in_ : in_.data();
    void* out = device_ ? dev_out_ : out_.data();
    CollectiveOptions co;
    co.label = OpName(op_);
    const auto f32 = CommDataType::kFloat32;
    switch (op_) {
      case Op::kAllGather:
        return comm_.AllGather(in, out, per_rank_, f32, co).Wait();
      case Op::kReduceScatter:
        return comm_.ReduceScatter(in, out, per_rank_, f32, ReduceOp::kSum, co).Wait();
      case Op::kAllReduce:
        return comm_.AllReduce(in, out, total_, f32, ReduceOp::kSum, co).Wait();
      case Op::kBroadcast:
        return comm_.Broadcast(out, total_, f32, Root(k), co).Wait();
    }
    return Status::OK();
  }

  // Elements of iteration k's result that differ from the expected values.
  Result<uint64_t> Check(int k) {
    if (device_ != nullptr) {
      STRATA_RETURN_IF_ERROR(
          device_->CopyToHost(out_.data(), dev_out_, out_.size() * 4, "bench result"));
      STRATA_RETURN_IF_ERROR(device_->SynchronizeLane(Lane::kD2H));
    }
    const int r = comm_.rank();
    uint64_t wrong = 0;
    for (size_t i = 0; i < out_.size(); ++i) {
      float want = 0;
      switch (op_) {
        case Op::kAllGather:
          want = Value(int(i / per_rank_), i, k);
          break;
        case Op::kReduceScatter:
        case Op::kAllReduce: {
          const size_t g = op_ == Op::kReduceScatter ? size_t(r) * per_rank_ + i : i;
          for (int q = 0; q < n_; ++q) want += Value(q, g, k);
          break;
        }
        case Op::kBroadcast:
          want = Value(Root(k), i, k);
          break;
      }
      if (!(out_[i] == want)) ++wrong;
    }
    return wrong;
  }

 private:
  int Root(int k) const { return k % n_; }

  Communicator& comm_;
  Device* device_;
  Op op_;
  int n_;
  size_t total_, per_rank_ = 0;
  std::vector<float> in_, out_;
  void* dev_in_ = nullptr;
  void* dev_out_ = nullptr;
};

struct Row {
  std::string backend;
  Op op;
  uint64_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;  // GB/s (1e9 bytes)
  uint64_t wrong = 0;
};

// Times one size of one collective: --warmup untimed iterations, then --iters timed ones,
// each after a barrier on `host` (Gloo) and checked afterwards. The time is the slowest
// rank's mean; #wrong the sum over ranks.
Result<Row> Measure(const Flags& f, Communicator& comm, Communicator& host, Device* device, Op op,
                    size_t total) {
  Case c(comm, device, op, total);
  STRATA_RETURN_IF_ERROR(c.Allocate());
  double seconds = 0;
  uint64_t wrong = 0;
  for (int k = 0; k < f.warmup + f.iters; ++k) {
    STRATA_RETURN_IF_ERROR(c.Prepare(k));
    STRATA_RETURN_IF_ERROR(host.Barrier().Wait());
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(
        c.Run(k).Annotate(std::string(OpName(op)) + " of " + std::to_string(total * 4) + " bytes"));
    const auto t1 = Clock::now();
    STRATA_ASSIGN_OR_RETURN(uint64_t w, c.Check(k));
    if (k < f.warmup) continue;
    seconds += std::chrono::duration<double>(t1 - t0).count();
    wrong += w;
  }
  struct Figures {
    double seconds;
    uint64_t wrong;
  };
  STRATA_ASSIGN_OR_RETURN(
      auto all, AllGatherMessages(host, Figures{seconds, wrong}, "bench comm: time and #wrong"));
  Row row;
  row.backend = comm.backend();
  row.op = op;
  row.count = total;
  row.bytes = total * 4;
  for (const Figures& fig : all) {
    row.time_us = std::max(row.time_us, fig.seconds / f.iters * 1e6);
    row.wrong += fig.wrong;
  }
  row.algbw = row.time_us > 0 ? double(row.bytes) / (row.time_us * 1e3) : 0;
  row.busbw = row.algbw * BusFactor(op, comm.world_size());
  return row;
}

// The socket copy that bounds the collectives: rank 1 listens on the address its Gloo
// transport advertised (the store's "addr/1"), rank 0 connects and sends `bytes`, rank 1
// reads them and times from the first byte to the last; rank 0 gets the figure by broadcast.
// GB/s; 0 with fewer than 2 ranks or bytes == 0.
Result<double> TcpBound(Communicator& host, uint64_t bytes, std::chrono::milliseconds timeout) {
  if (host.world_size() < 2 || bytes == 0) return 0.0;
  const int r = host.rank();
  double gbps = 0;
  auto store = host.store();
  if (r == 1) {
    STRATA_ASSIGN_OR_RETURN(std::string addrs, store->Get("addr/1", timeout));
    std::string ip = addrs.substr(0, addrs.find(' '));
    if (ip.starts_with("[")) {
      ip = ip.substr(1, ip.find(']') - 1);
    } else {
      ip = ip.substr(0, ip.rfind(':'));
    }
    addrinfo hints = {};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    addrinfo* res = nullptr;
    if (::getaddrinfo(ip.c_str(), "0", &hints, &res) != 0) {
      return Status::InvalidArgument("bench comm: cannot parse rank 1's address " + ip);
    }
    int lfd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool bound =
        lfd >= 0 && ::bind(lfd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(lfd, 1) == 0;
    ::freeaddrinfo(res);
    if (!bound) {
      if (lfd >= 0) ::close(lfd);
      return Status::FromErrno(errno, "bench comm: listening on " + ip + " for the TCP bound");
    }
    sockaddr_storage sa = {};
    socklen_t len = sizeof sa;
    ::getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len);
    const int port =
        ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
    std::vector<char> buf(1 << 20);
    std::string endpoint = ip.find(':') != std::string::npos ? "[" + ip + "]" : ip;
    endpoint += ":" + std::to_string(port);
    std::vector<char> msg(endpoint.begin(), endpoint.end());
    msg.resize(64, '\0');
    STRATA_RETURN_IF_ERROR(host.Broadcast(msg.data(), msg.size(), CommDataType::kByte, 1).Wait());
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, int(timeout.count())) != 1) {
      ::close(lfd);
      return Status::Timeout("bench comm: rank 0 did not connect for the TCP bound");
    }
    int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(lfd);
    if (fd < 0) return Status::FromErrno(errno, "bench comm: accepting the TCP bound's connection");
    uint64_t got = 0;
    Clock::time_point first;
    while (got < bytes) {
      ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      if (got == 0) first = Clock::now();
      got += uint64_t(n);
    }
    const double s = std::chrono::duration<double>(Clock::now() - first).count();
    ::close(fd);
    if (got < bytes) return Status::Comm("bench comm: the TCP bound's copy ended early");
    gbps = s > 0 ? double(got) / s / 1e9 : 0;
  } else {
    std::vector<char> msg(64, '\0');
    STRATA_RETURN_IF_ERROR(host.Broadcast(msg.data(), msg.size(), CommDataType::kByte, 1).Wait());
    if (r == 0) {
      std::string endpoint(msg.data());
      const size_t colon = endpoint.rfind(':');
      std::string ip = endpoint.substr(0, colon), port = endpoint.substr(colon + 1);
      if (ip.starts_with("[")) ip = ip.substr(1, ip.size() - 2);
      addrinfo hints = {};
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICHOST;
      addrinfo* res = nullptr;
      if (::getaddrinfo(ip.c_str(), port.c_str(), &hints, &res) != 0) {
        return Status::InvalidArgument("bench comm: bad TCP bound endpoint " + endpoint);
      }
      int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
      ::freeaddrinfo(res);
      if (!ok) {
        if (fd >= 0) ::close(fd);
        return Status::FromErrno(errno,
                                 "bench comm: connecting to " + endpoint + " for the TCP bound");
      }
      std::vector<char> buf(1 << 20, 'x');
      uint64_t sent = 0;
      while (sent < bytes) {
        ssize_t n =
            ::send(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - sent), MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += uint64_t(n);
      }
      ::close(fd);
    }
  }
  double figure = gbps;
  STRATA_RETURN_IF_ERROR(host.Broadcast(&figure, sizeof figure, CommDataType::kByte, 1).Wait());
  return figure;
}

std::string Gb(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// The message sizes in fp32 elements: --min-bytes to --max-bytes times --factor, each a
// multiple of the rank count (at least one element per rank), without repeats.
Result<std::vector<size_t>> Sizes(const Flags& f, int n) {
  STRATA_ASSIGN_OR_RETURN(uint64_t lo, ParseBytes("--min-bytes", f.min_bytes));
  STRATA_ASSIGN_OR_RETURN(uint64_t hi, ParseBytes("--max-bytes", f.max_bytes));
  if (lo == 0 || lo > hi) {
    return Status::InvalidArgument("--min-bytes " + f.min_bytes + " and --max-bytes " +
                                   f.max_bytes + ": expected 0 < min <= max");
  }
  if (!(f.factor > 1)) {
    return Status::InvalidArgument("--factor " + std::to_string(f.factor) + ": expected > 1");
  }
  std::vector<size_t> out;
  for (double b = double(lo); b <= double(hi) * (1 + 1e-12); b *= f.factor) {
    size_t count = size_t(b) / 4;
    count = std::max(size_t(n), count - count % size_t(n));
    if (out.empty() || out.back() != count) out.push_back(count);
  }
  return out;
}

Result<std::vector<Op>> Ops(const Flags& f) {
  if (f.ops.empty()) return std::vector<Op>(std::begin(kOps), std::end(kOps));
  std::vector<Op> out;
  for (const std::string& name : f.ops) {
    auto it =
        std::find_if(std::begin(kOps), std::end(kOps), [&](Op op) { return name == OpName(op); });
    if (it == std::end(kOps)) {
      return Status::InvalidArgument("--op " + name +
                                     ": expected all-gather, reduce-scatter, all-reduce or "
                                     "broadcast");
    }
    out.push_back(*it);
  }
  return out;
}

// The communicators to measure: Gloo (host memory) and NCCL (device memory, GPU LOCAL_RANK).
struct Backend {
  std::string name;
  Communicator* comm = nullptr;
  Device* device = nullptr;  // NCCL: where its buffers live
};

class BenchComm {
 public:
  explicit BenchComm(Flags f) : f_(std::move(f)) {}

  int Run() {
    std::string what;
    Status s = RunChecked(&what);
    if (!s.ok()) {
      std::fprintf(stderr, "strata bench comm: %s%s%s\n", what.c_str(), what.empty() ? "" : ": ",
                   s.ToString().c_str());
      return 1;
    }
    if (wrong_ > 0) {
      std::fprintf(stderr, "strata bench comm: %llu wrong element(s): the collectives are broken\n",
                   static_cast<unsigned long long>(wrong_));
      return 1;
    }
    return 0;
  }

 private:
  Status RunChecked(std::string* what) {
    STRATA_ASSIGN_OR_RETURN(rank_, RankFromEnvOrSingle());
    STRATA_ASSIGN_OR_RETURN(std::vector<Op> ops, Ops(f_));
    STRATA_ASSIGN_OR_RETURN(std::vector<size_t> sizes, Sizes(f_, rank_.world_size));
    STRATA_ASSIGN_OR_RETURN(uint64_t tcp_bytes, ParseBytes("--tcp-bytes", f_.tcp_bytes));
    if (f_.iters < 1 || f_.warmup < 0) {
      return Status::InvalidArgument("--iters must be >= 1 and --warmup >= 0");
    }
    bool gloo = f_.backends.empty(), nccl = f_.backends.empty() && CudaAvailable();
    for (const std::string& b : f_.backends) {
      if (b == "gloo") {
        gloo = true;
      } else if (b == "nccl") {
        nccl = true;
      } else if (b == "auto") {
        gloo = true;
        nccl = nccl || CudaAvailable();
      } else {
        return Status::InvalidArgument("--backend " + b + ": expected auto, gloo or nccl");
      }
    }
    JoinOptions jo;
    jo.rendezvous = f_.rendezvous;
    jo.timeout_seconds = f_.comm_timeout;
    jo.run_secret = f_.run_secret;
    jo.run_secret_file = f_.run_secret_file;
    jo.store_prefix = "strata-bench-comm";
    jo.one_rank_folder_prefix = "/tmp/strata-bench-comm-rdzv-";
    STRATA_ASSIGN_OR_RETURN(joined_, JoinRanks(rank_, jo, what));
    Communicator& host = *joined_.gloo;
    std::vector<Backend> backends;
    if (gloo) backends.push_back({"gloo", &host, nullptr});
    if (nccl) {
      *what = "--backend nccl (GPU " + std::to_string(rank_.local_rank) + ")";
      DeviceOptions dopt;
      dopt.cuda_device = rank_.local_rank;
      STRATA_ASSIGN_OR_RETURN(cuda_, CreateCudaDevice(dopt));
      STRATA_ASSIGN_OR_RETURN(nccl_, CreateEngineNccl(joined_, "nccl", *cuda_));
      backends.push_back({"nccl", nccl_.get(), cuda_.get()});
    }
    what->clear();
    const bool lead = rank_.rank == 0;
    if (lead) STRATA_RETURN_IF_ERROR(CheckOutput("--json", f_.json));  // before the run
    const JsonDestination json(lead ? f_.json : "");
    STRATA_ASSIGN_OR_RETURN(tcp_gbps_, TcpBound(host, tcp_bytes, joined_.options.timeout));
    if (lead) PrintHeader(sizes, backends);
    std::vector<Row> rows;
    for (const Backend& b : backends) {
      for (Op op : ops) {
        if (lead) PrintTableHead(b.name, op);
        for (size_t count : sizes) {
          STRATA_ASSIGN_OR_RETURN(Row row, Measure(f_, *b.comm, host, b.device, op, count));
          wrong_ += row.wrong;
          if (lead) PrintRow(row);
          rows.push_back(row);
        }
      }
    }
    if (!lead) return Status::OK();
    PrintSummary(rows);
    if (json.enabled()) STRATA_RETURN_IF_ERROR(json.Write("--json", Json(rows).dump(2) + "\n"));
    return Status::OK();
  }

  void PrintHeader(const std::vector<size_t>& sizes, const std::vector<Backend>& backends) const {
    std::string names;
    for (const Backend& b : backends) names += (names.empty() ? "" : ", ") + b.name;
    std::printf("# strata bench comm: %d rank(s)%s, backends %s\n", rank_.world_size,
                rank_.source.empty() ? "" : (" (" + rank_.source + " variables)").c_str(),
                names.c_str());
    std::printf("# rendezvous %s, timeout %.3g s\n", joined_.options.rendezvous.ToString().c_str(),
                joined_.options.timeout.count() / 1e3);
    std::printf(
        "# sizes %zu B .. %zu B by x%g (fp32, a multiple of %d elements), %d iterations "
        "after %d warm-up, each after a barrier and checked in full\n",
        sizes.front() * 4, sizes.back() * 4, f_.factor, rank_.world_size, f_.iters, f_.warmup);
    std::printf(
        "# time: the slowest rank's mean per iteration; algbw = size / time; busbw = "
        "algbw x (n-1)/n (all-gather, reduce-scatter), 2(n-1)/n (all-reduce), 1 "
        "(broadcast); GB/s = 1e9 B/s\n");
    if (tcp_gbps_ > 0) {
      std::printf("# bound: TCP rank 0 -> rank 1, one socket, %s: %s GB/s (busbw/tcp below)\n",
                  f_.tcp_bytes.c_str(), Gb(tcp_gbps_).c_str());
    }
  }

  void PrintTableHead(const std::string& backend, Op op) const {
    std::printf("#\n# %s %s (%s)\n", backend.c_str(), OpName(op),
                op == Op::kBroadcast   ? "in place, root = iteration mod n"
                : op == Op::kAllGather ? "out of place"
                                       : "out of place, sum");
    std::printf("# %12s %12s %10s %11s %11s %9s %7s\n", "size(B)", "count(elts)", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "busbw/tcp", "#wrong");
  }

  void PrintRow(const Row& r) const {
    std::string ratio = tcp_gbps_ > 0 ? Gb(r.busbw / tcp_gbps_) : "-";
    std::printf("  %12llu %12llu %10.1f %11s %11s %9s %7llu\n",
                static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.count),
                r.time_us, Gb(r.algbw).c_str(), Gb(r.busbw).c_str(), ratio.c_str(),
                static_cast<unsigned long long>(r.wrong));
    std::fflush(stdout);
  }

  void PrintSummary(const std::vector<Row>& rows) const {
    double sum = 0;
    for (const Row& r : rows) sum += r.busbw;
    std::printf("#\n# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong_),
                wrong_ == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %s GB/s\n",
                Gb(rows.empty() ? 0 : sum / double(rows.size())).c_str());
  }

  nlohmann::json Json(const std::vector<Row>& rows) const {
    nlohmann::json out;
    out["ranks"] = rank_.world_size;
    out["rendezvous"] = joined_.options.rendezvous.ToString();
    out["iters"] = f_.iters;
    out["warmup"] = f_.warmup;
    out["tcp_bound_gbps"] = tcp_gbps_;
    out["wrong"] = wrong_;
    nlohmann::json results = nlohmann::json::array();
    for (const Row& r : rows) {
      results.push_back({{"backend", r.backend},
                         {"op", OpName(r.op)},
                         {"bytes", r.bytes},
                         {"count", r.count},
                         {"time_us", r.time_us},
                         {"algbw_gbps", r.algbw},
                         {"busbw_gbps", r.busbw},
                         {"bus_factor", BusFactor(r.op, rank_.world_size)},
                         {"wrong", r.wrong}});
    }
    out["results"] = results;
    return out;
  }

  Flags f_;
  RankInfo rank_;
  // Destroyed in reverse: NCCL before its device, both before the Gloo ranks.
  JoinedRanks joined_;
  std::unique_ptr<Device> cuda_;
  std::unique_ptr<Communicator> nccl_;
  double tcp_gbps_ = 0;
  uint64_t wrong_ = 0;
};

}  // namespace

void AddBenchComm(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = bench.add_subcommand(
      "comm",
      "The collectives (all-gather, reduce-scatter, all-reduce, broadcast) per message size, "
      "nccl-tests style: time, algbw, busbw, #wrong (every result checked), against the TCP "
      "bandwidth between two ranks measured in the same run.\n"
      "Example: strata launch -n 4 --output rank0 -- strata bench comm --max-bytes 64M");
  cmd->add_option("--op", flags->ops,
                  "Collective to measure (repeatable): all-gather, reduce-scatter, all-reduce, "
                  "broadcast (default: all four)");
  cmd->add_option("--backend", flags->backends,
                  "gloo, nccl or auto (repeatable; default auto: gloo, and nccl too when this "
                  "build has CUDA and a GPU is present; NCCL uses GPU LOCAL_RANK)");
  cmd->add_option("--min-bytes", flags->min_bytes, "Smallest message size")->capture_default_str();
  cmd->add_option("--max-bytes", flags->max_bytes, "Largest message size")->capture_default_str();
  cmd->add_option("--factor", flags->factor, "Size multiplier between rows (> 1)")
      ->capture_default_str();
  cmd->add_option("--iters", flags->iters, "Timed iterations per size")->capture_default_str();
  cmd->add_option("--warmup", flags->warmup, "Untimed iterations per size before them")
      ->capture_default_str();
  cmd->add_option("--tcp-bytes", flags->tcp_bytes,
                  "Bytes of the socket copy from rank 0 to rank 1 that measures the TCP bound "
                  "(0: none)")
      ->capture_default_str();
  cmd->add_option("--rendezvous", flags->rendezvous,
                  "file:DIR or redis://HOST:PORT[/PREFIX] (default: STRATA_RENDEZVOUS, which "
                  "`strata launch` sets)");
  cmd->add_option("--comm-timeout", flags->comm_timeout,
                  "Seconds that bound the rendezvous and every collective (0: "
                  "STRATA_COMM_TIMEOUT, default 300)")
      ->capture_default_str();
  AddRunSecretFlags(cmd, &flags->run_secret, &flags->run_secret_file);
  cmd->add_option("--json", flags->json,
                  "Write the results as JSON to FILE (rank 0; '-': standard output, the table "
                  "goes to standard error)");
  // A later copy of a flag wins, so that a script's defaults can be overridden after them.
  for (const char* name : {"--min-bytes", "--max-bytes", "--factor", "--iters", "--warmup",
                           "--tcp-bytes", "--comm-timeout", "--json"}) {
    cmd->get_option(name)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  cmd->callback([flags, exit_code] { *exit_code = BenchComm(*flags).Run(); });
}

}  // namespace strata::cli
