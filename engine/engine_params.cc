// EngineImpl's calls between steps: writing and reading parameters and components, and
// committing values written. Each drains the last step's deferred updates first.
#include "engine/engine_impl.h"

namespace strata::engine_internal {

Status EngineImpl::CheckBlockTensor(int block, int tensor) const {
  if (block < 0 || block >= ctx_.L) {
    return Status::InvalidArgument("block " + std::to_string(block) + " out of range [0, " +
                                   std::to_string(ctx_.L) + ")");
  }
  if (tensor < 0 || tensor >= int(ctx_.layout[block].tensors.size())) {
    return Status::InvalidArgument("tensor " + std::to_string(tensor) +
                                   " out of range for block '" + ctx_.layout[block].name + "'");
  }
  return Status::OK();
}

Status EngineImpl::WriteParams(int block, int tensor, std::span<const float> values) {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, tensor));
  MutexLock lock(&ctx_.mu);
  STRATA_RETURN_IF_ERROR(ctx_.error);
  if (ctx_.step_open) return Status::InvalidArgument("WriteParams during a step");
  STRATA_RETURN_IF_ERROR(DrainLocked());
  const BlockLayout& bl = ctx_.layout[block];
  const TensorLayout& t = bl.tensors[tensor];
  if (values.size() != t.numel) {
    return Status::InvalidArgument("WriteParams: tensor '" + bl.name + "." + t.name + "' has " +
                                   std::to_string(t.numel) + " elements, got " +
                                   std::to_string(values.size()));
  }
  STRATA_RETURN_IF_ERROR(host_.WriteTensorLocked(block, t, values));
  params_dirty_ = true;
  return Status::OK();
}

Status EngineImpl::CommitParams() {
  MutexLock lk(&ctx_.mu);
  STRATA_RETURN_IF_ERROR(ctx_.error);
  if (ctx_.step_open) return Status::InvalidArgument("CommitParams during a step");
  STRATA_RETURN_IF_ERROR(DrainLocked());
  if (!params_dirty_ || !host_.has_store()) return Status::OK();
  const uint64_t step = uint64_t(ctx_.resumed_step + ctx_.step + ctx_.args.step_offset);
  if (host_.CommittedStep() && *host_.CommittedStep() >= step) {
    return Status::InvalidArgument(
        "CommitParams: step " + std::to_string(step) +
        " is already committed; new values are committed with the next step");
  }
  STRATA_RETURN_IF_ERROR(host_.CommitLocked(step));
  params_dirty_ = false;
  return Status::OK();
}

Status EngineImpl::ReadParams(int block, int tensor, std::span<float> out) const {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, tensor));
  const BlockLayout& bl = ctx_.layout[block];
  const TensorLayout& t = bl.tensors[tensor];
  if (out.size() != t.numel) {
    return Status::InvalidArgument("ReadParams: tensor '" + bl.name + "." + t.name + "' has " +
                                   std::to_string(t.numel) + " elements, got room for " +
                                   std::to_string(out.size()));
  }
  std::vector<float> shard(bl.shard_numel);
  STRATA_RETURN_IF_ERROR(ReadComponent(block, Component::kMaster, shard));
  // Every rank's shard of the block (one rank: the shard is the block).
  std::vector<float> all(bl.padded_numel);
  STRATA_RETURN_IF_ERROR(
      collectives_->AllGatherHost(shard.data(), all.data(), shard.size(), "all-gather read params")
          .Annotate("ReadParams of block '" + bl.name + "'"));
  std::copy(all.begin() + t.offset, all.begin() + t.offset + t.numel, out.begin());
  return Status::OK();
}

Status EngineImpl::ReadComponent(int block, Component component, std::span<float> out) const {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, 0));
  if (component == Component::kGrad) {
    return Status::InvalidArgument("ReadComponent: gradients are freed after each update");
  }
  if (component == Component::kParam) component = Component::kMaster;
  MutexLock lock(&ctx_.mu);
  if (ctx_.step_open) return Status::InvalidArgument("ReadComponent during a step");
  // A read sees the last step's updates: the deferred ones run now. (Logically const: what
  // a read returns was fixed when EndStep returned.)
  STRATA_RETURN_IF_ERROR(const_cast<EngineImpl*>(this)->DrainLocked());
  const int obj = ObjIndex(block, component);
  const uint64_t n = ctx_.layout[block].shard_numel;
  if (out.size() != n) {
    return Status::InvalidArgument("ReadComponent: block '" + ctx_.layout[block].name + "' has " +
                                   std::to_string(n) + " elements, got room for " +
                                   std::to_string(out.size()));
  }
  const BlockStateLayout& state = ctx_.place.state[block];
  if (component == Component::kMaster && state.master.elem_bytes == 4) {
    return host_.ReadObjLocked(obj, out.data());  // fp32
  }
  // As stored (bf16 widened exactly, int8 dequantized: strata/state_layout.h).
  std::vector<uint8_t> stored(ctx_.place.DataBytes(ctx_.layout, obj));
  STRATA_RETURN_IF_ERROR(host_.ReadObjLocked(obj, stored.data()));
  if (component == Component::kMaster) return DecodeMaster(state, stored, out);
  return DecodeMoment(state, component, stored, out);
}

Status EngineImpl::WriteComponent(int block, Component component, std::span<const float> values) {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, 0));
  MutexLock lock(&ctx_.mu);
  STRATA_RETURN_IF_ERROR(ctx_.error);
  if (ctx_.step_open) return Status::InvalidArgument("WriteComponent during a step");
  STRATA_RETURN_IF_ERROR(DrainLocked());  // the last step's deferred updates land first
  STRATA_RETURN_IF_ERROR(host_.WriteComponentLocked(block, component, values));
  params_dirty_ = true;
  return Status::OK();
}

}  // namespace strata::engine_internal
