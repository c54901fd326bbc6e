// See engine/engine_options.h.
#include "engine/engine_options.h"

#include <cmath>
#include <string>

#include "strata/comm.h"
#include "strata/device.h"

namespace strata::engine_internal {

Status CheckOptimizerOptions(const EngineOptions& opt) {
  if (opt.grad_clip < 0 || !std::isfinite(opt.grad_clip)) {
    return Status::InvalidArgument("grad_clip must be >= 0");
  }
  if (!(opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 && opt.beta2 < 1 && opt.eps >= 0 &&
        opt.weight_decay >= 0)) {
    return Status::InvalidArgument("optimizer hyper-parameters out of range (beta1 " +
                                   std::to_string(opt.beta1) + ", beta2 " +
                                   std::to_string(opt.beta2) + ", eps " + std::to_string(opt.eps) +
                                   ", weight_decay " + std::to_string(opt.weight_decay) + ")");
  }
  if (opt.activation_count < 0) {
    return Status::InvalidArgument("activation_count is " + std::to_string(opt.activation_count) +
                                   "; it must be >= 0");
  }
  return Status::OK();
}

Status CheckStepArgs(const StepArgs& args, const std::vector<BlockLayout>& layout,
                     int64_t steps_done, std::optional<uint64_t> committed) {
  if (!(args.lr >= 0) || !std::isfinite(args.lr) || !(args.grad_scale > 0) ||
      !std::isfinite(args.grad_scale)) {
    return Status::InvalidArgument("BeginStep: lr must be >= 0 and grad_scale > 0 (lr " +
                                   std::to_string(args.lr) + ", grad_scale " +
                                   std::to_string(args.grad_scale) + ")");
  }
  const int64_t counted = steps_done + 1 + args.step_offset;
  if (counted < 1) {
    return Status::InvalidArgument("BeginStep: step_offset " + std::to_string(args.step_offset) +
                                   " makes the bias correction's step count " +
                                   std::to_string(counted) + "; it must be >= 1");
  }
  if (committed && counted <= int64_t(*committed)) {
    return Status::InvalidArgument(
        "BeginStep: this step would commit as step " + std::to_string(counted) + " (steps run " +
        std::to_string(steps_done) + ", step_offset " + std::to_string(args.step_offset) +
        "), and the NVMe store has committed step " + std::to_string(*committed) +
        " already; its commits only go forward: load older state into an engine with empty "
        "NVMe folders");
  }
  for (size_t i = 0; i < args.groups.size(); ++i) {
    const OptimizerGroup& g = args.groups[i];
    if (!(g.lr >= 0) || !std::isfinite(g.lr) || !(g.beta1 >= 0 && g.beta1 < 1) ||
        !(g.beta2 >= 0 && g.beta2 < 1) || !(g.eps >= 0) || !(g.weight_decay >= 0) ||
        !std::isfinite(g.eps) || !std::isfinite(g.weight_decay)) {
      return Status::InvalidArgument(
          "BeginStep: optimizer group " + std::to_string(i) + " out of range (lr " +
          std::to_string(g.lr) + ", beta1 " + std::to_string(g.beta1) + ", beta2 " +
          std::to_string(g.beta2) + ", eps " + std::to_string(g.eps) + ", weight_decay " +
          std::to_string(g.weight_decay) + "): lr, eps, weight_decay >= 0, betas in [0, 1)");
    }
  }
  if (args.groups.empty()) return Status::OK();
  for (const BlockLayout& b : layout) {
    for (const TensorLayout& t : b.tensors) {
      if (t.group < 0 || size_t(t.group) >= args.groups.size()) {
        return Status::InvalidArgument(
            "BeginStep: tensor '" + b.name + "." + t.name + "' is in optimizer group " +
            std::to_string(t.group) + ", but the step gives " + std::to_string(args.groups.size()) +
            " groups (StepArgs::groups)");
      }
    }
  }
  return Status::OK();
}

Result<EngineOptions> ResolveRankOptions(const EngineOptions& options) {
  EngineOptions opt = options;
  if (opt.comm) {
    if (opt.world_size != 1 && opt.world_size != opt.comm->world_size()) {
      return Status::InvalidArgument("EngineOptions::world_size " + std::to_string(opt.world_size) +
                                     " differs from the communicator's " +
                                     std::to_string(opt.comm->world_size()) +
                                     "; leave it at 1 (it is taken from the communicator)");
    }
    opt.world_size = opt.comm->world_size();
    opt.rank = opt.comm->rank();
    if (!opt.device) return Status::InvalidArgument("EngineOptions::device is required");
    const std::string backend = opt.comm->backend();
    if (opt.host_comm) {
      if (opt.host_comm->device_buffers()) {
        return Status::InvalidArgument(
            std::string("EngineOptions::host_comm must be a host-memory communicator (gloo), "
                        "not ") +
            opt.host_comm->backend());
      }
      if (opt.host_comm->world_size() != opt.world_size || opt.host_comm->rank() != opt.rank) {
        return Status::InvalidArgument(
            "EngineOptions::host_comm is rank " + std::to_string(opt.host_comm->rank()) + " of " +
            std::to_string(opt.host_comm->world_size()) + " but comm is rank " +
            std::to_string(opt.rank) + " of " + std::to_string(opt.world_size) +
            "; both must join the same ranks");
      }
    } else if (opt.comm->device_buffers()) {
      return Status::InvalidArgument(
          "EngineOptions::comm (" + backend +
          ") needs device buffers, but the engine's host-side collectives (the gradient norm, "
          "ReadParams) need host memory: set EngineOptions::host_comm to a host-memory "
          "communicator (gloo) over the same ranks");
    }
    // Whether the communicator can read and write the device's memory: NCCL reaches CUDA
    // memory; a host communicator reaches a HostDevice's, which is host memory.
    const bool cuda = opt.device->Kind() == DeviceKind::kCuda;
    if (opt.comm->device_buffers() && !cuda) {
      return Status::InvalidArgument("EngineOptions::comm (" + backend +
                                     ") works on CUDA device memory; this device is " +
                                     opt.device->Name() + " (use a gloo communicator)");
    }
    const bool reaches_device = opt.comm->device_buffers() == cuda;
    if (opt.grad_dtype == GradDtype::kBf16) {
      // The ranks' bf16 gradients are widened to fp32 in host memory and reduce-scattered
      // there, summed in fp32. In device memory the reduce-scatter would sum bf16 (or need a
      // widening on the device, and copy fp32 to the host after all).
      if (opt.collective_memory == CollectiveMemory::kDevice) {
        return Status::InvalidArgument(
            "collective memory 'device' (--collective-memory device) with bf16 gradients "
            "(grad_dtype bf16): bf16 gradients are widened to fp32 in host memory before the "
            "reduce-scatter; use collective memory 'host' (or auto) or grad_dtype fp32");
      }
      if (opt.comm->device_buffers()) {
        return Status::InvalidArgument(
            "bf16 gradients (grad_dtype bf16) are reduce-scattered in host memory, which the " +
            backend +
            " communicator cannot reach; use a gloo communicator for comm (--comm-backend gloo) "
            "or grad_dtype fp32 (collectives in device memory copy only this rank's 1/N of each "
            "gradient to the host)");
      }
      opt.collective_memory = CollectiveMemory::kHost;
    }
    if (opt.collective_memory == CollectiveMemory::kAuto) {
      opt.collective_memory = reaches_device ? CollectiveMemory::kDevice : CollectiveMemory::kHost;
    } else if (opt.collective_memory == CollectiveMemory::kDevice && !reaches_device) {
      return Status::InvalidArgument(
          "collective memory 'device': a " + backend +
          " communicator cannot reach CUDA device memory; use an NCCL communicator for comm "
          "(with gloo as host_comm) or collective memory 'host'");
    } else if (opt.collective_memory == CollectiveMemory::kHost && opt.comm->device_buffers()) {
      return Status::InvalidArgument("collective memory 'host': the " + backend +
                                     " communicator needs device buffers; use 'device' (or "
                                     "auto), or a gloo communicator");
    }
  } else if (opt.world_size != 1 || opt.rank != 0) {
    return Status::InvalidArgument("world_size " + std::to_string(opt.world_size) +
                                   " needs EngineOptions::comm (the communicator of the ranks)");
  }
  return opt;
}

}  // namespace strata::engine_internal
