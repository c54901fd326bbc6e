// Gloo backend of strata::Communicator: the collective worker. See comm/gloo_communicator.h
// for the design; the stores are in comm/gloo_store.*, naming a lost rank in
// comm/gloo_forensics.*.
//
// Worker loop (GlooCommunicator::Run): pops one Op at a time in issue order; if the
// communicator is already broken the op fails with Aborted and the original cause, else it
// waits for the op's `after` event, runs the Gloo algorithm, and completes the handle.
// Nothing Gloo throws crosses this file's boundary: every call into Gloo is wrapped and the
// exception becomes a Status (Timeout / Comm / InvalidArgument), decorated with the lost
// rank when it can be inferred. The first failure breaks the communicator for good, since
// the ranks may now disagree on which collective they are in.
#include "comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/gloo_forensics.h"
#include "comm/gloo_store.h"
#include "strata/comm.h"
#include "strata/env.h"
#include "strata/log.h"

namespace strata {
namespace {

using namespace std::chrono_literals;
using gloo_internal::CleanGlooMessage;
using gloo_internal::GlooKeyValueStore;
using gloo_internal::LockedGlooStore;
using gloo_internal::OpenStoreCore;
using gloo_internal::StoreCore;

// ------------------------------------------------------------------------------------------
// Handles and ops
// ------------------------------------------------------------------------------------------

class GlooHandle final : public CommHandle::Impl {
 public:
  Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  bool Done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void Complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

struct Op {
  const char* name;
  std::string label;
  uint64_t bytes = 0;
  EventPtr after;
  // Runs the Gloo algorithm; may throw. The uint32 is a tag unique per op.
  std::function<void(uint32_t tag)> run;
  std::shared_ptr<GlooHandle> handle;
};

// Chunking of reduce-scatter so its scratch memory stays bounded.
std::atomic<size_t> g_reduce_scatter_max_elements{size_t{1} << 24};  // 64 MiB of fp32
// The slot prefix of Strata's own reduce-scatter; Gloo's collectives use 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x53;

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const CommOptions& options, std::shared_ptr<StoreCore> core,
                   std::shared_ptr<GlooKeyValueStore> kv,
                   std::shared_ptr<gloo::rendezvous::Context> context,
                   std::vector<std::string> addresses,
                   std::vector<std::vector<std::string>> endpoints,
                   std::vector<std::string> identities)
      : rank_(options.rank.rank),
        world_(options.rank.world_size),
        timeout_(options.timeout),
        core_(std::move(core)),
        kv_(kv),
        context_(std::move(context)),
        forensics_(rank_, world_, timeout_, std::move(kv), std::move(addresses),
                   std::move(endpoints), std::move(identities)) {
    worker_ = std::thread([this] { Run(); });
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // Closing the connections before the context goes tells peers at once that this rank
    // left (they see "connection closed" rather than waiting for their timeout).
    if (context_) {
      try {
        context_->closeConnections();
      } catch (const std::exception& e) {
        LogDebug(std::string("gloo: closing connections: ") + e.what());
      }
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "gloo"; }
  bool device_buffers() const override { return false; }
  std::shared_ptr<KeyValueStore> store() const override { return kv_; }
  void SetObserver(std::function<void(const CommOpRecord&)> observer) override {
    std::lock_guard<std::mutex> lock(mu_);
    observer_ = std::move(observer);
  }

  CommHandle AllGather(const void* input, void* output, size_t count, CommDataType type,
                       const CollectiveOptions& options) override {
    size_t esize = CommDataTypeSize(type);
    size_t bytes = count * esize;
    if (count > 0 && (input == nullptr || output == nullptr)) {
      return Invalid("all-gather: null buffer with count " + std::to_string(count));
    }
    auto* out = static_cast<uint8_t*>(output);
    const auto* in = static_cast<const uint8_t*>(input);
    bool in_place = in == out + static_cast<size_t>(rank_) * bytes;
    if (!in_place && count > 0 && Overlaps(in, bytes, out, bytes * world_)) {
      return Invalid("all-gather: input overlaps output other than at output + rank*count");
    }
    uint64_t bus = bytes * static_cast<uint64_t>(world_ - 1);
    return Enqueue("all-gather", options, bus, [=, this](uint32_t tag) {
      if (bytes == 0) return;
      if (world_ == 1) {
        if (!in_place) std::memcpy(out, in, bytes);
        return;
      }
      gloo::AllgatherOptions opts(context_);
      if (!in_place) opts.setInput(const_cast<uint8_t*>(in), bytes);
      opts.setOutput(out, bytes * world_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  CommHandle ReduceScatter(const void* input, void* output, size_t count, CommDataType type,
                           ReduceOp op, const CollectiveOptions& options) override {
    if (type != CommDataType::kFloat32) return Invalid("reduce-scatter: only fp32 is supported");
    if (op != ReduceOp::kSum && op != ReduceOp::kAverage) {
      return Invalid(std::string("reduce-scatter: op ") + ReduceOpName(op) +
                     " is not supported (sum or avg)");
    }
    if (count > 0 && (input == nullptr || output == nullptr)) {
      return Invalid("reduce-scatter: null buffer with count " + std::to_string(count));
    }
    const auto* in = static_cast<const float*>(input);
    auto* out = static_cast<float*>(output);
    const bool in_place = out == in + static_cast<size_t>(rank_) * count;
    if (!in_place && count > 0 && Overlaps(in, count * world_ * 4, out, count * 4)) {
      return Invalid("reduce-scatter: output overlaps input other than at input + rank*count");
    }
    uint64_t bus = count * 4 * static_cast<uint64_t>(world_ - 1);
    return Enqueue("reduce-scatter", options, bus, [=, this](uint32_t tag) {
      if (count == 0) return;
      if (world_ == 1) {
        if (!in_place) std::memcpy(out, in, count * sizeof(float));
        return;
      }
      DirectReduceScatter(in, out, count, op == ReduceOp::kAverage, tag);
    });
  }

  CommHandle AllReduce(const void* input, void* output, size_t count, CommDataType type,
                       ReduceOp op, const CollectiveOptions& options) override {
    if (type != CommDataType::kFloat32) return Invalid("all-reduce: only fp32 is supported");
    if (count > 0 && (input == nullptr || output == nullptr)) {
      return Invalid("all-reduce: null buffer with count " + std::to_string(count));
    }
    const auto* in = static_cast<const float*>(input);
    auto* out = static_cast<float*>(output);
    if (count > 0 && in != out && Overlaps(in, count * 4, out, count * 4)) {
      return Invalid("all-reduce: input and output overlap without being equal");
    }
    uint64_t bus = 2 * count * 4 * static_cast<uint64_t>(world_ - 1) / world_;
    return Enqueue("all-reduce", options, bus, [=, this](uint32_t tag) {
      if (count == 0) return;
      if (world_ > 1) {
        gloo::AllreduceOptions opts(context_);
        if (in != out) opts.setInput(const_cast<float*>(in), count);
        opts.setOutput(out, count);
        using Fn = void (*)(void*, const void*, const void*, size_t);
        Fn fn = op == ReduceOp::kMax ? static_cast<Fn>(&gloo::max<float>)
                                     : static_cast<Fn>(&gloo::sum<float>);
        opts.setReduceFunction(fn);
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        gloo::allreduce(opts);
      } else if (in != out) {
        std::memcpy(out, in, count * sizeof(float));
      }
      if (op == ReduceOp::kAverage) {
        const float n = static_cast<float>(world_);
        for (size_t i = 0; i < count; ++i) out[i] /= n;
      }
    });
  }

  CommHandle Broadcast(void* buffer, size_t count, CommDataType type, int root,
                       const CollectiveOptions& options) override {
    if (root < 0 || root >= world_) {
      return Invalid("broadcast: root " + std::to_string(root) + " is outside [0, " +
                     std::to_string(world_) + ")");
    }
    size_t bytes = count * CommDataTypeSize(type);
    if (count > 0 && buffer == nullptr) return Invalid("broadcast: null buffer");
    auto* buf = static_cast<uint8_t*>(buffer);
    return Enqueue("broadcast", options, bytes, [=, this](uint32_t tag) {
      if (bytes == 0 || world_ == 1) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(buf, bytes);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  CommHandle Barrier(const CollectiveOptions& options) override {
    return Enqueue("barrier", options, 0, [this](uint32_t tag) {
      if (world_ == 1) return;
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Reduce-scatter by direct exchange, in pieces: for each piece, this rank sends slot r's
  // piece of its input to rank r and receives every peer's piece of its own slot, each on
  // this op's tagged slot (unique per op, so back-to-back calls never share a buffer), then
  // sums the contributions in rank order 0..N-1 (the same order on every rank and run, so
  // the result does not depend on timing). Every send is waited for before the piece's sum
  // is written: an in-place output aliases only this rank's own slot, which is never sent.
  //
  // This replaces Gloo's ReduceScatterHalvingDoubling, which returned wrong elements under
  // load: a rank other than 0 moves its reduced chunk to the front of the buffer while its
  // own send of that front half may still be in flight, so the peer receives a mix of
  // input and result (seen as hundreds of wrong elements in `bench comm` at 128 KiB+).
  // Bytes on the wire are (N-1)/N of the input per rank, as for the ring or halving-doubling.
  // Throws what Gloo throws (timeout, closed connection); the worker turns it into a Status.
  void DirectReduceScatter(const float* in, float* out, size_t count, bool average, uint32_t tag) {
    const size_t piece_max = std::max<size_t>(1, g_reduce_scatter_max_elements.load() / world_);
    std::vector<float> scratch(std::min(count, piece_max) * world_);
    auto send =
        context_->createUnboundBuffer(const_cast<float*>(in), count * world_ * sizeof(float));
    auto recv = context_->createUnboundBuffer(scratch.data(), scratch.size() * sizeof(float));
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    for (size_t off = 0; off < count; off += piece_max) {
      const size_t piece = std::min(piece_max, count - off);
      const size_t piece_bytes = piece * sizeof(float);
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        recv->recv(r, slot, r * piece_bytes, piece_bytes);
        send->send(r, slot, (r * count + off) * sizeof(float), piece_bytes);
      }
      for (int i = 0; i < world_ - 1; ++i) {
        if (!recv->waitRecv(timeout_)) throw std::runtime_error("reduce-scatter: receive aborted");
      }
      for (int i = 0; i < world_ - 1; ++i) {
        if (!send->waitSend(timeout_)) throw std::runtime_error("reduce-scatter: send aborted");
      }
      const float* mine = in + rank_ * count + off;
      float* dst = out + off;
      for (size_t e = 0; e < piece; ++e) {
        float acc = rank_ == 0 ? mine[e] : scratch[e];
        for (int r = 1; r < world_; ++r) acc += r == rank_ ? mine[e] : scratch[r * piece + e];
        dst[e] = average ? acc / static_cast<float>(world_) : acc;
      }
    }
  }

  static bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    auto pa = reinterpret_cast<uintptr_t>(a);
    auto pb = reinterpret_cast<uintptr_t>(b);
    return pa < pb + b_bytes && pb < pa + a_bytes;
  }

  // Invalid arguments fail this rank's handle without touching the network (the other
  // ranks then time out in the matching collective, naming this one as silent).
  static CommHandle Invalid(std::string message) {
    return CommHandle::Completed(Status::InvalidArgument(std::move(message)));
  }

  CommHandle Enqueue(const char* name, const CollectiveOptions& options, uint64_t bytes,
                     std::function<void(uint32_t)> run) {
    auto handle = std::make_shared<GlooHandle>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(
          Op{name, std::string(options.label), bytes, options.after, std::move(run), handle});
    }
    cv_.notify_one();
    return CommHandle(handle);
  }

  void Run() {
    uint32_t tag = 0;
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        op = std::move(queue_.front());
        queue_.pop_front();
        if (stop_) {
          lock.unlock();
          op.handle->Complete(
              Status::Aborted(std::string(op.name) + ": communicator destroyed before it ran"));
          continue;
        }
      }
      ++tag;
      if (!broken_.ok()) {
        op.handle->Complete(Status::Aborted(std::string(op.name) +
                                            ": communicator is unusable after an earlier "
                                            "failure: " +
                                            broken_.ToString()));
        continue;
      }
      Status status;
      if (op.after) status = op.after->Synchronize();
      if (!status.ok()) {
        status.Annotate(std::string(op.name) + ": waiting for the event it must follow");
      }
      auto start = std::chrono::steady_clock::now();
      if (status.ok()) status = RunGloo(op, tag);
      auto end = std::chrono::steady_clock::now();
      if (!status.ok()) broken_ = status;
      std::function<void(const CommOpRecord&)> observer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        observer = observer_;
      }
      if (observer) observer(CommOpRecord{op.name, op.label, start, end, op.bytes, status.ok()});
      op.handle->Complete(std::move(status));
    }
  }

  Status RunGloo(Op& op, uint32_t tag) {
    std::string what;
    try {
      op.run(tag);
      return Status::OK();
    } catch (const gloo::Exception& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    }
    return forensics_.Failure(op.name, what);
  }

  const int rank_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<StoreCore> core_;
  std::shared_ptr<GlooKeyValueStore> kv_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  // Names the lost rank when a collective fails (worker thread only).
  gloo_internal::PeerLossForensics forensics_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stop_ = false;
  std::function<void(const CommOpRecord&)> observer_;
  Status broken_;  // worker thread only
  std::thread worker_;
};

// The host to listen on: options.hostname, else STRATA_COMM_HOST, else loopback when all
// ranks are on this host, else gethostname(). A name that resolves only to loopback while
// ranks span hosts is refused: Debian maps the host name to 127.0.1.1, and peers would then
// try to reach this rank on their own machine.
// The first IPv4 (else IPv6) address of network interface `name` (GLOO_SOCKET_IFNAME, as
// torch's Gloo reads it). InvalidArgument naming the interface and the ones that have an
// address when it has none.
Result<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return Status::FromErrno(errno, "getifaddrs");
  std::string v4, v6, known;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (known.find(std::string(" ") + i->ifa_name + ",") == std::string::npos) {
      known += std::string(" ") + i->ifa_name + ",";
    }
    if (name != i->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* a =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    if (::inet_ntop(family, a, buf, sizeof buf) == nullptr) continue;
    if (family == AF_INET && v4.empty()) v4 = buf;
    if (family == AF_INET6 && v6.empty()) v6 = buf;
  }
  ::freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  if (!known.empty()) known.pop_back();
  return Status::InvalidArgument("GLOO_SOCKET_IFNAME=" + name +
                                 ": no interface of that name has an address (these do:" + known +
                                 "); set it to one of them, or set STRATA_COMM_HOST");
}

Result<std::string> ListenHost(const CommOptions& options) {
  std::string host = options.hostname;
  if (host.empty()) host = EnvGet("STRATA_COMM_HOST");
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      host.empty() && ifname != nullptr && *ifname != '\0') {
    return InterfaceAddress(ifname);
  }
  const bool one_host = options.rank.local_world_size <= 0 ||
                        options.rank.local_world_size >= options.rank.world_size;
  if (host.empty()) {
    if (one_host) return std::string("127.0.0.1");
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return Status::FromErrno(errno, "gethostname");
    host = buf;
  }
  if (one_host) return host;
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return Status::InvalidArgument("gloo: host '" + host + "' does not resolve (" +
                                   gai_strerror(rc) +
                                   "); set STRATA_COMM_HOST to this host's address");
  }
  bool all_loopback = true;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(a->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) all_loopback = false;
    } else if (a->ai_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(a->ai_addr);
      if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) all_loopback = false;
    }
  }
  ::freeaddrinfo(res);
  if (all_loopback) {
    return Status::InvalidArgument(
        "gloo: host '" + host + "' resolves only to a loopback address, but the " +
        std::to_string(options.rank.world_size) +
        " ranks span hosts (LOCAL_WORLD_SIZE=" + std::to_string(options.rank.local_world_size) +
        "); set STRATA_COMM_HOST to an address of this host the other hosts can reach");
  }
  return host;
}

}  // namespace

void gloo_internal::SetReduceScatterPieceForTesting(size_t elements) {
  g_reduce_scatter_max_elements = elements;
}

Result<std::shared_ptr<KeyValueStore>> OpenKeyValueStore(const RendezvousSpec& spec,
                                                         const std::string& prefix) {
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<StoreCore> core, OpenStoreCore(spec));
  return std::shared_ptr<KeyValueStore>(std::make_shared<GlooKeyValueStore>(core, prefix));
}

namespace {

// Every rank announces itself, then waits for all others, so that a missing rank is reported
// by number rather than as an anonymous store timeout inside Gloo.
Status WaitForEveryRank(GlooKeyValueStore& kv, const CommOptions& options,
                        const std::string& where) {
  const RankInfo& ri = options.rank;
  STRATA_RETURN_IF_ERROR(kv.Set("join/" + std::to_string(ri.rank), "1"));
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < ri.world_size; ++r) {
      STRATA_ASSIGN_OR_RETURN(std::optional<std::string> joined,
                              kv.Peek("join/" + std::to_string(r)));
      if (!joined) missing.push_back(r);
    }
    if (missing.empty()) return Status::OK();
    if (const int sig = gloo_internal::RendezvousInterrupted(); sig != 0) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      return gloo_internal::InterruptedStatus(sig, where, "rank(s) " + list + " to join");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string list, refused;
      for (int r : missing) {
        list += (list.empty() ? "" : ", ") + std::to_string(r);
        // A join key that is there but does not verify: say which, and why.
        Result<std::string> seen = kv.Get("join/" + std::to_string(r), 0ms);
        const std::string& m = seen.status().message();
        if (!seen.ok() && m.find("refused: ") != std::string::npos) {
          std::string why = m.substr(m.find("refused: ") + 9);
          if (!why.empty() && why.back() == ')') why.pop_back();
          refused += "; key '" + m.substr(5, m.find('\'', 5) - 5) + "' was refused: " + why;
        }
      }
      return Status::Timeout(
          "rendezvous " + where + ": rank(s) " + list + " of " + std::to_string(ri.world_size) +
          " did not join within " + std::to_string(options.timeout.count()) +
          " ms (not started, crashed, or pointed at another rendezvous)" + refused);
    }
    std::this_thread::sleep_for(10ms);
  }
}

// Gloo's full mesh of TCP pairs, listening on `hostname`; *own_address: this rank's listening
// address as its peers got it.
Result<std::shared_ptr<gloo::rendezvous::Context>> ConnectFullMesh(
    const CommOptions& options, const std::shared_ptr<StoreCore>& core, const std::string& hostname,
    const std::string& where, std::string* own_address) {
  const RankInfo& ri = options.rank;
  std::string gstore_key;  // the last key Gloo read, for a malformed one
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    std::shared_ptr<gloo::transport::Device> device;
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return Status::InvalidArgument("gloo: cannot listen on host '" + hostname +
                                     "': " + CleanGlooMessage(e.what()) +
                                     " (pass a host name or address of this machine that "
                                     "the other ranks can reach)");
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(ri.rank, ri.world_size);
    context->setTimeout(options.timeout);
    LockedGlooStore gstore(core, options.store_prefix + "/gloo");
    try {
      context->connectFullMesh(gstore, device);
    } catch (...) {
      gstore_key = gstore.last_key;
      throw;
    }
    const int peer = (ri.rank + 1) % ri.world_size;
    *own_address =
        gloo_internal::ListenAddressFromPairAddress(context->getPair(peer)->address().str());
    return context;
  } catch (const gloo_internal::RendezvousInterruptedError& e) {
    return gloo_internal::InterruptedStatus(e.signal, where, "the other ranks' addresses");
  } catch (const gloo::EnforceNotMet& e) {
    // Gloo checked what it read from the store and found it malformed (a planted or forged
    // key, without a run secret to refuse it): name the key, not Gloo's assertion.
    LogDebug(std::string("gloo: connectFullMesh: ") + e.what());
    return Status::InvalidArgument(
        "gloo: connecting rank " + std::to_string(ri.rank) + " of " +
        std::to_string(ri.world_size) + " through " + where + ": key '" +
        (gstore_key.empty() ? std::string("?") : gstore_key) +
        "' does not hold a rank's addresses as strata writes them (another run, or a process "
        "that is not one of this run's ranks, wrote it); delete it, use another prefix, and "
        "give the run a secret (--run-secret, STRATA_RUN_SECRET) so that such keys are "
        "ignored");
  } catch (const std::exception& e) {
    std::string msg = CleanGlooMessage(e.what());
    std::string text = "gloo: connecting rank " + std::to_string(ri.rank) + " of " +
                       std::to_string(ri.world_size) + " through " + where + " failed: " + msg;
    return gloo_internal::LooksLikeTimeout(msg) ? Status::Timeout(text) : Status::Comm(text);
  }
}

// Every rank's TCP endpoints (listening address first) and process identity, published and
// collected, so that failures can name ranks whichever end of a connection Gloo's message
// shows. `addresses[rank]` is this rank's own on entry; every rank's on return.
struct RankEndpoints {
  std::vector<std::string> addresses;
  std::vector<std::vector<std::string>> endpoints;
  std::vector<std::string> identities;
};
Result<RankEndpoints> ExchangeEndpoints(GlooKeyValueStore& kv, const CommOptions& options,
                                        gloo::rendezvous::Context& context,
                                        const std::string& own_address) {
  const RankInfo& ri = options.rank;
  RankEndpoints out;
  out.addresses.resize(ri.world_size);
  out.endpoints.resize(ri.world_size);
  out.identities.resize(ri.world_size);
  out.addresses[ri.rank] = own_address;
  // The accepting side of a connection may still hold it in the kernel's backlog when
  // connectFullMesh returns; wait (briefly) until every peer's socket is in our table.
  std::vector<std::string> local;
  const auto until = std::chrono::steady_clock::now() +
                     std::min<std::chrono::milliseconds>(options.timeout, 5000ms);
  for (;;) {
    int established = 0;
    local = gloo_internal::LocalTcpEndpoints(&established);
    if (established >= ri.world_size - 1 || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(2ms);
  }
  // Each pair has its own address, the one its peer got through the rendezvous and names in
  // error messages; these come first.
  std::string mine = own_address;
  for (int r = 0; r < ri.world_size; ++r) {
    if (r == ri.rank) continue;
    std::string a =
        gloo_internal::ListenAddressFromPairAddress(context.getPair(r)->address().str());
    if (a != own_address) mine += " " + a;
  }
  for (const std::string& e : local) {
    if (e != own_address) mine += " " + e;
  }
  STRATA_RETURN_IF_ERROR(kv.Set("addr/" + std::to_string(ri.rank), mine));
  STRATA_RETURN_IF_ERROR(
      kv.Set("proc/" + std::to_string(ri.rank), gloo_internal::ProcessIdentity()));
  for (int r = 0; r < ri.world_size; ++r) {
    Result<std::string> proc = kv.Get("proc/" + std::to_string(r), options.timeout);
    if (proc.ok()) out.identities[r] = *proc;
    Result<std::string> a = kv.Get("addr/" + std::to_string(r), options.timeout);
    if (!a.ok()) {
      Status s = a.status();
      return s.Annotate("gloo: collecting rank " + std::to_string(r) + "'s addresses");
    }
    std::istringstream in(*a);
    for (std::string e; in >> e;) out.endpoints[r].push_back(e);
    if (!out.endpoints[r].empty()) out.addresses[r] = out.endpoints[r][0];
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options) {
  const RankInfo& ri = options.rank;
  if (ri.world_size < 1 || ri.rank < 0 || ri.rank >= ri.world_size) {
    return Status::InvalidArgument("gloo communicator: rank " + std::to_string(ri.rank) +
                                   " is outside world size " + std::to_string(ri.world_size));
  }
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return Status::InvalidArgument("gloo communicator: the timeout must be positive");
  }
  // Gloo writes to sockets without MSG_NOSIGNAL: a peer that dies mid-send would kill this
  // process with SIGPIPE instead of failing the collective. Ignore SIGPIPE unless the
  // program installed its own handler.
  {
    struct sigaction current = {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  }
  // Checked first: a host the others cannot reach should fail here, not as a timeout.
  STRATA_ASSIGN_OR_RETURN(std::string hostname, ListenHost(options));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<StoreCore> core, OpenStoreCore(options.rendezvous));
  core->keep_written = false;  // until the ranks have joined (below)
  auto kv = std::make_shared<GlooKeyValueStore>(core, options.store_prefix);
  const std::string where = options.rendezvous.ToString();

  if (ri.world_size == 1) {
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(options, core, kv, nullptr, {std::string()}, {{}}, {std::string()}));
  }
  STRATA_RETURN_IF_ERROR(WaitForEveryRank(*kv, options, where));
  std::string own_address;
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<gloo::rendezvous::Context> context,
                          ConnectFullMesh(options, core, hostname, where, &own_address));
  STRATA_ASSIGN_OR_RETURN(RankEndpoints ends,
                          ExchangeEndpoints(*kv, options, *context, own_address));
  {
    // The run joined: a folder keeps its keys (forensics reads them; the folder is the
    // run's own). A failed or interrupted join deletes them on the way out.
    std::lock_guard<std::mutex> lock(core->mu);
    core->keep_written = options.rendezvous.kind == RendezvousSpec::Kind::kFile;
  }
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(options, core, kv, std::move(context), std::move(ends.addresses),
                           std::move(ends.endpoints), std::move(ends.identities)));
}

}  // namespace strata
