// strata._strata.Engine: a Device (HostDevice or CUDA) and the Engine over it, with the step
// API of include/strata/engine.h one call each. Addresses cross as ints; the Python layer
// (python/strata/_offload.py) wraps them as tensors.
//
// Hand-offs between torch and the engine's compute lane (python/strata/_offload.py, _Handoff):
// on a HostDevice torch computes on the calling thread, so Acquire drains the compute lane
// (GIL released) before torch reads the memory. On a CUDA device nothing here waits on the
// host: Acquire returns once the copies are enqueued, and the layer orders the two streams
// with events through compute_stream (torch's stream waits on the engine's lane after an
// acquire; the engine's lane waits on torch's stream before a release or a submit).
// Ownership: the device outlives the communicators, which outlive the engine (members in that
// order). One Python thread drives the step API, as the engine requires.
#include "strata/engine.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "python/src/binding.h"
#include "strata/device.h"
#include "strata/io.h"
#include "strata/optim.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// One tensor: (name, shape, weight_decay, optimizer group).
using TensorTuple = std::tuple<std::string, std::vector<int64_t>, bool, int>;
// One optimizer group's settings for a step: (lr, beta1, beta2, eps, weight_decay).
using GroupTuple = std::tuple<double, double, double, double, double>;
// One block: (name, tensors).
using BlockTuple = std::pair<std::string, std::vector<TensorTuple>>;

struct EngineConfig {
  std::string device = "cpu";  // cpu | cuda | auto
  uint64_t device_mem = 0;
  uint64_t host_mem = 0;
  std::vector<std::string> nvme;
  bool resume = false;
  bool durable = false;
  int micro_batches = 1;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, grad_clip = 0.0;
  bool adamw = true;
  bool pipeline = true;  // EngineOptions::pipeline_updates
  int optimizer_threads = 0;
  std::string trace_path;
  std::string rendezvous;      // file:DIR or redis:HOST:PORT; "" = STRATA_RENDEZVOUS
  std::string dtype = "auto";  // the working dtype: auto | fp32 | bf16 (the model's)
  int cuda_device = -1;        // the GPU; -1 = the launcher's local rank (0 without one)
  // The CLI's run flags (tools/strata/run_flags.cc), checked by the Python layer; ints are
  // the enums' values (auto, on, off; fp32, bf16; ...).
  int speculate = 0;          // Speculation
  int grad_spill = 0;         // GradSpill
  int state_format = 0;       // StateFormat
  int state_rounding = 1;     // StateRounding (stochastic)
  int master_format = 0;      // MasterFormat (0 fp32, 1 bf16 with stochastic rounding)
  std::string io = "auto";    // ParseIoBackendKind
  uint64_t io_block = 0;      // nvme_stripe_bytes; 0 = the default
  int collective_memory = 0;  // CollectiveMemory
  // EngineOptions::activation_bytes/count: the block inputs the layer stashes (0 = none).
  uint64_t activation_bytes = 0;
  int activation_count = 0;
};

WorkingDtype ParseDtype(const std::string& name) {
  if (name == "auto") return WorkingDtype::kAuto;
  if (name == "fp32") return WorkingDtype::kFp32;
  if (name == "bf16") return WorkingDtype::kBf16;
  ThrowIfError(
      Status::InvalidArgument("dtype '" + name + "': expected \"auto\", \"fp32\" or \"bf16\""));
  return WorkingDtype::kAuto;
}

// The GPU this process uses: `configured` when >= 0, else the launcher's local rank (torchrun's
// LOCAL_RANK, Open MPI's, Slurm's), so that the ranks on one host use one GPU each; 0 for a
// single process.
int CudaDeviceFor(int configured) {
  if (configured >= 0) return configured;
  Result<RankInfo> rank = RankInfoFromEnv();
  if (!rank.ok()) {
    if (rank.status().code() == StatusCode::kNotFound) return 0;  // no launcher
    ThrowIfError(rank.status());
  }
  return rank->local_rank;
}

// The ranks of a launcher's run (torchrun, strata launch, mpirun, srun), joined through Gloo as
// `strata train` joins them; nullptr for a single process.
std::unique_ptr<Communicator> JoinGloo(const EngineConfig& c, CommOptions* used) {
  Result<RankInfo> rank = RankInfoFromEnv();
  if (!rank.ok()) {
    if (rank.status().code() == StatusCode::kNotFound) return nullptr;  // no launcher
    ThrowIfError(rank.status());
  }
  if (rank->world_size == 1) return nullptr;
  std::string text = c.rendezvous;
  if (text.empty()) {
    const char* env = std::getenv("STRATA_RENDEZVOUS");
    if (env != nullptr) text = env;
  }
  if (text.empty()) {
    ThrowIfError(Status::InvalidArgument(
        "this process is rank " + std::to_string(rank->rank) + " of " +
        std::to_string(rank->world_size) + " (" + rank->source +
        ") but no rendezvous is given: set STRATA_RENDEZVOUS=file:DIR (a fresh folder every "
        "rank sees) or pass strata.Engine(rendezvous=...)"));
  }
  Result<RendezvousSpec> spec = ParseRendezvous(text);
  ThrowIfError(spec.status());
  CommOptions o;
  o.rank = *rank;
  o.rendezvous = *spec;
  o.store_prefix = "strata-python";
  if (std::getenv("STRATA_COMM_TIMEOUT") != nullptr) {
    Result<std::chrono::milliseconds> t = CommTimeoutFromEnv();
    ThrowIfError(t.status());
    o.timeout = *t;
  }
  Result<std::unique_ptr<Communicator>> comm = Status::OK();
  {
    py::gil_scoped_release release;
    comm = CreateGlooCommunicator(o);
  }
  ThrowIfError(Status(comm.status()).Annotate("joining the other ranks"));
  *used = o;
  return std::move(*comm);
}

// On a CUDA device the engine's collectives run through NCCL, on the device's comm lane,
// meeting the other ranks through the Gloo communicator's store; nullptr where this build has
// no NCCL (the engine then gathers through Gloo in pinned host memory).
std::unique_ptr<Communicator> JoinNccl(CommOptions o, const Communicator& gloo, Device& device) {
  o.store_prefix += "-nccl";
  Result<std::unique_ptr<Communicator>> comm = Status::OK();
  {
    py::gil_scoped_release release;
    comm = CreateNcclCommunicator(o, gloo.store(), device);
  }
  if (comm.status().code() == StatusCode::kNotSupported) return nullptr;
  ThrowIfError(Status(comm.status()).Annotate("joining the other ranks through NCCL"));
  return std::move(*comm);
}

class PyEngine {
 public:
  PyEngine(const std::vector<BlockTuple>& blocks, const EngineConfig& c) {
    std::vector<BlockSpec> specs;
    for (const auto& [name, tensors] : blocks) {
      BlockSpec b{.name = name, .tensors = {}};
      for (const auto& [tname, shape, wd, group] : tensors) {
        b.tensors.push_back({.name = tname, .shape = shape, .weight_decay = wd, .group = group});
      }
      specs.push_back(std::move(b));
    }
    const bool cuda = c.device == "cuda" || (c.device == "auto" && CudaAvailable());
    if (c.device != "cpu" && c.device != "cuda" && c.device != "auto") {
      ThrowIfError(Status::InvalidArgument("device '" + c.device +
                                           "': expected \"cpu\", \"cuda\" or \"auto\""));
    }
    for (const std::string& p : c.nvme) CheckPathArgument(p, "nvme folder");
    CheckPathArgument(c.trace_path, "trace path");
    DeviceOptions dopt;
    if (cuda) dopt.cuda_device = CudaDeviceFor(c.cuda_device);
    Result<std::unique_ptr<Device>> dev = cuda ? CreateCudaDevice(dopt) : CreateHostDevice(dopt);
    if (!dev.ok() && cuda) {
      ThrowIfError(
          Status(dev.status()).Annotate("opening GPU " + std::to_string(dopt.cuda_device)));
    }
    ThrowIfError(dev.status());
    device_ = std::move(*dev);
    cuda_device_ = dopt.cuda_device;
    CommOptions joined;
    gloo_ = JoinGloo(c, &joined);
    if (gloo_ && cuda) nccl_ = JoinNccl(joined, *gloo_, *device_);
    EngineOptions o;
    o.device = device_.get();
    o.comm = nccl_ ? nccl_.get() : gloo_.get();
    o.dtype = ParseDtype(c.dtype);
    o.device_mem_bytes = c.device_mem;
    o.host_mem_bytes = c.host_mem;
    o.nvme_paths = c.nvme;
    o.resume = c.resume;
    o.durable = c.durable || c.resume;
    o.micro_batches = c.micro_batches;
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.weight_decay = c.weight_decay;
    o.grad_clip = c.grad_clip;
    o.optimizer = c.adamw ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
    o.pipeline_updates = c.pipeline;
    o.optimizer_threads = c.optimizer_threads;
    o.trace_path = c.trace_path;
    o.speculation = static_cast<Speculation>(c.speculate);
    o.grad_spill = static_cast<GradSpill>(c.grad_spill);
    o.state_format = static_cast<StateFormat>(c.state_format);
    o.state_rounding = static_cast<StateRounding>(c.state_rounding);
    o.master_format = static_cast<MasterFormat>(c.master_format);
    Result<IoBackendKind> io = ParseIoBackendKind(c.io);
    ThrowIfError(io.status());
    o.io.kind = *io;
    if (c.io_block != 0) o.nvme_stripe_bytes = c.io_block;
    o.collective_memory = static_cast<CollectiveMemory>(c.collective_memory);
    o.activation_bytes = c.activation_bytes;
    o.activation_count = c.activation_count;
    Result<std::unique_ptr<Engine>> e = Status::OK();
    {
      py::gil_scoped_release release;
      e = Engine::Create(std::move(specs), o);
    }
    ThrowIfError(e.status());
    engine_ = std::move(*e);
  }

  ~PyEngine() {
    engine_.reset();  // before the device and the communicators it uses
    nccl_.reset();
    gloo_.reset();
  }

  // Ends the engine now, not when Python lets go of this object (a traceback can keep it
  // alive): its threads stop, its memory is freed and its NVMe folders are unlocked, so an
  // Engine(resume=True) can reopen them. A step in progress is dropped, not committed. Every
  // later call raises.
  void Close() {
    py::gil_scoped_release release;
    engine_.reset();
    nccl_.reset();
    gloo_.reset();
  }

  int Rank() const { return gloo_ ? gloo_->rank() : 0; }
  int WorldSize() const { return gloo_ ? gloo_->world_size() : 1; }
  // "gloo", "nccl", or "" for a single rank: what the engine's collectives run on.
  std::string Backend() const { return nccl_ ? "nccl" : gloo_ ? "gloo" : ""; }
  // The cudaStream_t of the engine's compute lane, as an int (0 on a HostDevice).
  uintptr_t ComputeStream() {
    return reinterpret_cast<uintptr_t>(device_->NativeStream(Lane::kCompute));
  }
  // The GPU ordinal (-1 on a HostDevice).
  int CudaDevice() const { return device_->Kind() == DeviceKind::kCuda ? cuda_device_ : -1; }
  // Drains the engine's compute lane (the host hand-off; see the file comment).
  void SynchronizeCompute() {
    py::gil_scoped_release release;
    ThrowIfError(device_->SynchronizeLane(Lane::kCompute));
  }
  // Every rank gets rank 0's `n` floats at `address` (one rank: nothing to do).
  void BroadcastF32(uintptr_t address, size_t n) {
    if (!gloo_) return;
    py::gil_scoped_release release;
    CollectiveOptions co;
    co.label = "broadcast initial weights";
    ThrowIfError(
        gloo_->Broadcast(reinterpret_cast<void*>(address), n, CommDataType::kFloat32, 0, co)
            .Wait()
            .Annotate("receiving the initial weights from rank 0"));
  }

  // Every rank's `n` floats at `src`, in rank order, into `dst` (n x world_size floats): a
  // collective, every rank calls it. One rank: a copy.
  void AllGatherF32(uintptr_t src, size_t n, uintptr_t dst) {
    if (!gloo_) {
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                   n * sizeof(float));
      return;
    }
    py::gil_scoped_release release;
    CollectiveOptions co;
    co.label = "all-gather optimizer state";
    ThrowIfError(gloo_
                     ->AllGather(reinterpret_cast<const void*>(src), reinterpret_cast<void*>(dst),
                                 n, CommDataType::kFloat32, co)
                     .Wait()
                     .Annotate("gathering the optimizer state of every rank"));
  }

  py::list Layout() const {
    py::list out;
    for (const BlockLayout& b : Live().Layout()) {
      py::list tensors;
      for (const TensorLayout& t : b.tensors) {
        tensors.append(py::make_tuple(t.name, t.shape, t.offset, t.numel));
      }
      out.append(py::make_tuple(b.name, tensors, b.padded_numel));
    }
    return out;
  }

  std::string DeviceKindName() const {
    return device_->Kind() == DeviceKind::kCuda ? "cuda" : "cpu";
  }
  std::string Dtype() const { return WorkingDtypeName(Live().Placement().dtype); }
  std::string Placement() const { return Live().Placement().ToString(); }
  int64_t ResumedStep() const { return Live().ResumedStep(); }

  void WriteParams(int block, int tensor, uintptr_t address, size_t n) {
    py::gil_scoped_release release;
    ThrowIfError(Live().WriteParams(
        block, tensor, std::span<const float>(reinterpret_cast<const float*>(address), n)));
  }
  void ReadParams(int block, int tensor, uintptr_t address, size_t n) const {
    py::gil_scoped_release release;
    ThrowIfError(
        Live().ReadParams(block, tensor, std::span<float>(reinterpret_cast<float*>(address), n)));
  }
  // One component ("master", "exp_avg", "exp_avg_sq") of this rank's shard of a block: n
  // fp32 values (bf16 moments widened) written to `address`; between steps.
  void ReadComponent(int block, const std::string& name, uintptr_t address, size_t n) const {
    const Component c = ParseComponent(name);
    py::gil_scoped_release release;
    ThrowIfError(
        Live().ReadComponent(block, c, std::span<float>(reinterpret_cast<float*>(address), n)));
  }
  // The mirror of ReadComponent (Engine::WriteComponent): n fp32 values read from `address`.
  void WriteComponent(int block, const std::string& name, uintptr_t address, size_t n) {
    const Component c = ParseComponent(name);
    py::gil_scoped_release release;
    ThrowIfError(Live().WriteComponent(
        block, c, std::span<const float>(reinterpret_cast<const float*>(address), n)));
  }
  static Component ParseComponent(const std::string& name) {
    if (name == "master") return Component::kMaster;
    if (name == "exp_avg") return Component::kExpAvg;
    if (name == "exp_avg_sq") return Component::kExpAvgSq;
    ThrowIfError(Status::InvalidArgument("component '" + name +
                                         "': expected master, exp_avg or exp_avg_sq"));
    return Component::kMaster;
  }
  void CommitParams() {
    py::gil_scoped_release release;
    ThrowIfError(Live().CommitParams());
  }
  // `groups`: StepArgs::groups, one (lr, beta1, beta2, eps, weight_decay) per optimizer group.
  void BeginStep(double lr, double grad_scale, const std::vector<GroupTuple>& groups,
                 int64_t step_offset) {
    StepArgs args{.lr = lr, .grad_scale = grad_scale, .step_offset = step_offset};
    for (const auto& [glr, beta1, beta2, eps, wd] : groups) {
      args.groups.push_back(
          {.lr = glr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd});
    }
    py::gil_scoped_release release;
    ThrowIfError(Live().BeginStep(args));
  }
  // The address of the block's working parameters: readable once this returns on a HostDevice;
  // on CUDA by work ordered after the compute lane's work enqueued so far (see the file comment).
  uintptr_t Acquire(int block, bool backward) {
    py::gil_scoped_release release;
    Result<BlockView> v = Live().Acquire(block, backward ? Pass::kBackward : Pass::kForward);
    ThrowIfError(v.status());
    if (device_->Kind() == DeviceKind::kHost) {
      ThrowIfError(device_->SynchronizeLane(Lane::kCompute));
    }
    return reinterpret_cast<uintptr_t>(v->params);
  }
  void Release(int block) {
    py::gil_scoped_release release;
    ThrowIfError(Live().Release(block));
  }
  uintptr_t GradBuffer(int block) {
    Result<float*> g = Live().GradBuffer(block);
    ThrowIfError(g.status());
    return reinterpret_cast<uintptr_t>(*g);
  }
  void SubmitGrads(int block) {
    py::gil_scoped_release release;
    ThrowIfError(Live().SubmitGrads(block));
  }
  // SubmitGradsFrom: the gradient read from the caller's tensors (addresses, 0 for zeros),
  // which the caller keeps alive until grads_read() reaches the returned ticket.
  uint64_t SubmitGradsFrom(int block, const std::vector<uintptr_t>& addresses) {
    std::vector<const float*> grads;
    grads.reserve(addresses.size());
    for (uintptr_t a : addresses) grads.push_back(reinterpret_cast<const float*>(a));
    py::gil_scoped_release release;
    Result<uint64_t> ticket = Live().SubmitGradsFrom(block, grads);
    ThrowIfError(ticket.status());
    return *ticket;
  }
  uint64_t GradsRead() const { return Live().GradsRead(); }
  // Engine::StashActivation from torch's memory at `address` (the engine's device memory:
  // adopted for the copy). On a HostDevice it returns once the copy has landed, so the caller
  // may free or overwrite the tensor. On CUDA the host does not wait: the engine's compute
  // lane waits for the copy, and the caller orders torch's stream after that lane
  // (_handoff.to_torch) before it frees the tensor, whose memory torch's next kernels on that
  // stream may reuse; the caller ordered the lane after torch's work that wrote the tensor
  // (to_engine) before this call.
  void StashActivation(uint32_t key, uintptr_t address, uint64_t bytes) {
    const void* src = reinterpret_cast<const void*>(address);
    Status s;
    {
      py::gil_scoped_release release;
      s = device_->AdoptMemory(src, bytes);
      if (s.ok()) {
        // The copy is enqueued by the call (its source is read when the lane runs it).
        Result<EventPtr> landed = Live().StashActivation(key, src, bytes);
        if (!landed.ok()) {
          s = landed.status();
        } else if (device_->Kind() == DeviceKind::kHost) {
          s = (*landed)->Synchronize();
        } else {
          s = device_->WaitEvent(Lane::kCompute, *landed);
        }
        Status forget = device_->ForgetMemory(src);
        if (s.ok()) s = forget;
      }
    }
    ThrowIfError(s);
  }
  // Engine::FetchActivation into torch's memory at `address` (`bytes`, what was stashed). On
  // a HostDevice it returns once the bytes are there; on CUDA once the copy is enqueued, the
  // engine's compute lane after it (the caller then orders torch's stream after that lane,
  // and before it the lane after torch's earlier use of the memory). Corruption (a checksum
  // mismatch) or the I/O error of an activation read back from NVMe raises, and the step
  // cannot commit.
  void FetchActivation(uint32_t key, uintptr_t address, uint64_t bytes, bool last) {
    void* dst = reinterpret_cast<void*>(address);
    Status s;
    {
      py::gil_scoped_release release;
      s = device_->AdoptMemory(dst, bytes);
      if (s.ok()) {
        s = Live().FetchActivation(key, dst, last);
        // On the host the compute lane waits for the copy (FetchActivation's contract):
        // draining it is the copy's end, and then the memory is no longer used.
        if (device_->Kind() == DeviceKind::kHost) {
          Status drained = device_->SynchronizeLane(Lane::kCompute);
          if (s.ok()) s = drained;
        }
        Status forget = device_->ForgetMemory(dst);
        if (s.ok()) s = forget;
      }
    }
    ThrowIfError(s);
  }
  // The last step's deferred updates run and it commits (reads do it themselves).
  void Flush() {
    Status s;
    {
      py::gil_scoped_release release;
      s = Live().Flush();
    }
    ThrowIfError(s);
  }
  // Engine::SetOptimizerThreads (between steps).
  void SetOptimizerThreads(int threads) { ThrowIfError(Live().SetOptimizerThreads(threads)); }
  // Engine::GradNorm: the step's global norm before clipping, once every gradient is in.
  double GradNorm() {
    Result<double> r = Status::OK();
    {
      py::gil_scoped_release release;
      r = Live().GradNorm();
    }
    ThrowIfError(r.status());
    return *r;
  }
  py::dict EndStep() {
    Result<StepStats> r = Status::OK();
    {
      py::gil_scoped_release release;
      r = Live().EndStep();
    }
    ThrowIfError(r.status());
    return StatsDict(*r);
  }
  // Engine::TakeCommittedStats: the final statistics of the steps committed since the last
  // call, oldest first.
  py::list TakeCommittedStats() {
    std::vector<StepStats> done;
    {
      py::gil_scoped_release release;
      done = Live().TakeCommittedStats();
    }
    py::list out;
    for (const StepStats& s : done) out.append(StatsDict(s));
    return out;
  }

 private:
  Engine& Live() const {
    if (!engine_) ThrowIfError(Status::InvalidArgument("this engine was closed"));
    return *engine_;
  }

  static py::dict StatsDict(const StepStats& s) {
    py::dict d;
    d["step"] = s.step;
    d["seconds"] = s.seconds;
    d["bound_seconds"] = s.bound_seconds;
    d["bound"] = s.bound_resource;
    d["efficiency"] = s.efficiency;
    d["stall_seconds"] = s.stall_seconds;
    d["tail_seconds"] = s.tail_seconds;
    py::dict busy;
    for (int i = 0; i < kNumResources; ++i) {
      busy[ResourceName(static_cast<Resource>(i))] = s.busy_seconds[i];
    }
    busy["nvme"] = s.nvme_busy_seconds;
    d["busy_seconds"] = busy;
    py::dict bytes;
    bytes["nvme_read"] = s.bytes.nvme_read;
    bytes["nvme_write"] = s.bytes.nvme_write;
    bytes["h2d"] = s.bytes.h2d;
    bytes["d2h"] = s.bytes.d2h;
    bytes["comm"] = s.bytes.comm;
    d["bytes"] = bytes;
    py::dict act;
    act["nvme_read"] = s.activation_bytes.nvme_read;
    act["nvme_write"] = s.activation_bytes.nvme_write;
    act["h2d"] = s.activation_bytes.h2d;
    act["d2h"] = s.activation_bytes.d2h;
    d["activation_bytes"] = act;
    d["activation_fetch_waits"] = s.activation_fetch_waits;
    d["grad_norm"] = s.grad_norm;
    d["clip_coef"] = s.clip_coef;
    d["skipped"] = s.skipped;
    d["peak_device_bytes"] = s.peak_device_bytes;
    d["peak_host_bytes"] = s.peak_host_bytes;
    d["deferred_blocks"] = s.deferred_blocks;
    d["overlapped_seconds"] = s.overlapped_seconds;
    return d;
  }

  std::unique_ptr<Device> device_;
  int cuda_device_ = 0;
  std::unique_ptr<Communicator> gloo_;  // nullptr: a single rank
  std::unique_ptr<Communicator> nccl_;  // the engine's, on a CUDA device where NCCL is built
  std::unique_ptr<Engine> engine_;
};

}  // namespace

void BindEngine(py::module_& m) {
  py::class_<EngineConfig>(m, "EngineConfig")
      .def(py::init<>())
      .def_readwrite("device", &EngineConfig::device)
      .def_readwrite("device_mem", &EngineConfig::device_mem)
      .def_readwrite("host_mem", &EngineConfig::host_mem)
      .def_readwrite("nvme", &EngineConfig::nvme)
      .def_readwrite("resume", &EngineConfig::resume)
      .def_readwrite("durable", &EngineConfig::durable)
      .def_readwrite("micro_batches", &EngineConfig::micro_batches)
      .def_readwrite("beta1", &EngineConfig::beta1)
      .def_readwrite("beta2", &EngineConfig::beta2)
      .def_readwrite("eps", &EngineConfig::eps)
      .def_readwrite("weight_decay", &EngineConfig::weight_decay)
      .def_readwrite("grad_clip", &EngineConfig::grad_clip)
      .def_readwrite("adamw", &EngineConfig::adamw)
      .def_readwrite("pipeline", &EngineConfig::pipeline)
      .def_readwrite("optimizer_threads", &EngineConfig::optimizer_threads)
      .def_readwrite("trace_path", &EngineConfig::trace_path)
      .def_readwrite("rendezvous", &EngineConfig::rendezvous)
      .def_readwrite("dtype", &EngineConfig::dtype)
      .def_readwrite("cuda_device", &EngineConfig::cuda_device)
      .def_readwrite("speculate", &EngineConfig::speculate)
      .def_readwrite("grad_spill", &EngineConfig::grad_spill)
      .def_readwrite("state_format", &EngineConfig::state_format)
      .def_readwrite("state_rounding", &EngineConfig::state_rounding)
      .def_readwrite("master_format", &EngineConfig::master_format)
      .def_readwrite("io", &EngineConfig::io)
      .def_readwrite("io_block", &EngineConfig::io_block)
      .def_readwrite("collective_memory", &EngineConfig::collective_memory)
      .def_readwrite("activation_bytes", &EngineConfig::activation_bytes)
      .def_readwrite("activation_count", &EngineConfig::activation_count);
  m.def("cuda_available", &CudaAvailable);
  m.def("store_state_files", &StoreStateFiles, py::arg("index"), py::arg("folders"),
        "The files of a run's committed state in its NVMe folder `index` of `folders`: "
        "what a copy of the closed run takes and replaces, and nothing else.");
  m.def(
      "peek_committed_step",
      [](const std::string& folder) {
        Result<std::optional<uint64_t>> step = PeekCommittedStep(folder);
        ThrowIfError(step.status());
        return *step;
      },
      py::arg("folder"),
      "The step of the last commit of the store whose first folder is `folder` (None when it "
      "never committed), read without opening or locking it; strata.Error when the folder "
      "holds no manifest or a damaged one.");
  m.def("cuda_device_for", &CudaDeviceFor, py::arg("configured") = -1,
        "The GPU an Engine opens: `configured` when >= 0, else the launcher's local rank.");
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::vector<BlockTuple>&, const EngineConfig&>(), py::arg("blocks"),
           py::arg("config"))
      .def("layout", &PyEngine::Layout)
      .def_property_readonly("rank", &PyEngine::Rank)
      .def_property_readonly("world_size", &PyEngine::WorldSize)
      .def("broadcast_f32", &PyEngine::BroadcastF32)
      .def("all_gather_f32", &PyEngine::AllGatherF32, py::arg("src"), py::arg("n"), py::arg("dst"))
      .def_property_readonly("backend", &PyEngine::Backend)
      .def_property_readonly("compute_stream", &PyEngine::ComputeStream)
      .def_property_readonly("cuda_device", &PyEngine::CudaDevice)
      .def("synchronize_compute", &PyEngine::SynchronizeCompute)
      .def_property_readonly("device_kind", &PyEngine::DeviceKindName)
      .def_property_readonly("dtype", &PyEngine::Dtype)
      .def("placement", &PyEngine::Placement)
      .def("resumed_step", &PyEngine::ResumedStep)
      .def("write_params", &PyEngine::WriteParams)
      .def("read_params", &PyEngine::ReadParams)
      .def("commit_params", &PyEngine::CommitParams)
      .def("read_component", &PyEngine::ReadComponent)
      .def("write_component", &PyEngine::WriteComponent)
      .def("begin_step", &PyEngine::BeginStep, py::arg("lr"), py::arg("grad_scale") = 1.0,
           py::arg("groups") = std::vector<GroupTuple>{}, py::arg("step_offset") = 0)
      .def("acquire", &PyEngine::Acquire, py::arg("block"), py::arg("backward"))
      .def("release", &PyEngine::Release)
      .def("grad_buffer", &PyEngine::GradBuffer)
      .def("submit_grads", &PyEngine::SubmitGrads)
      .def("submit_grads_from", &PyEngine::SubmitGradsFrom, py::arg("block"), py::arg("addresses"))
      .def("grads_read", &PyEngine::GradsRead)
      .def("stash_activation", &PyEngine::StashActivation, py::arg("key"), py::arg("address"),
           py::arg("bytes"))
      .def("fetch_activation", &PyEngine::FetchActivation, py::arg("key"), py::arg("address"),
           py::arg("bytes"), py::arg("last") = true)
      .def("grad_norm", &PyEngine::GradNorm)
      .def("end_step", &PyEngine::EndStep)
      .def("flush", &PyEngine::Flush)
      .def("set_optimizer_threads", &PyEngine::SetOptimizerThreads, py::arg("threads"))
      .def("take_committed_stats", &PyEngine::TakeCommittedStats)
      .def("close", &PyEngine::Close);
}

}  // namespace strata::python
