// The collectives of one rank without a communicator, the choice of the implementation,
// and the check that every rank passes the same options.
#include "engine/collectives.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <utility>

#include "comm/rank_groups.h"
#include "engine/rank_collectives.h"

namespace strata::engine_internal {
namespace {

// One rank: the shard is the whole block; plain copies, the norm combined locally.
class NoCollectives final : public Collectives {
 public:
  NoCollectives(EngineContext& ctx, DeviceTier& device) : Collectives(ctx), device_(device) {}
  Result<EventPtr> FillParams(int a, void* dst) override {
    return device_.CopyShardToDevice(a, dst);
  }
  Result<EventPtr> LandGrad(int a, const void* src, void* dst, const EventPtr& computed) override {
    const int b = ctx_.schedule[a].block;
    const uint64_t n = ctx_.layout[b].shard_numel;
    const bool bf16 = ctx_.opt.grad_dtype == GradDtype::kBf16;
    STRATA_RETURN_IF_ERROR(ctx_.dev->WaitEvent(Lane::kD2H, computed));
    STRATA_RETURN_IF_ERROR(
        ctx_.dev->CopyToHost(dst, src, n * (bf16 ? 2 : 4), "d2h grad " + ctx_.layout[b].name));
    if (bf16) STRATA_RETURN_IF_ERROR(EnqueueWidenBf16Grad(*ctx_.dev, dst, n));
    return EventPtr();
  }
  Status AllGatherHost(const float* shard, float* all, uint64_t n,
                       const std::string&) const override {
    std::memcpy(all, shard, n * sizeof(float));
    return Status::OK();
  }

 private:
  DeviceTier& device_;
};

// FNV-1a over the bytes of the model description (blocks, tensor names, shapes, offsets,
// weight decay, optimizer groups) and of the schedule: {model hash, schedule hash}.
std::pair<uint64_t, uint64_t> ModelAndScheduleHashes(const EngineContext& ctx) {
  uint64_t model_hash = 1469598103934665603ull, schedule_hash = model_hash;
  auto mix = [](uint64_t* h, const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      *h = (*h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
    }
  };
  for (const BlockLayout& b : ctx.layout) {
    mix(&model_hash, b.name.data(), b.name.size() + 1);
    for (const TensorLayout& t : b.tensors) {
      mix(&model_hash, t.name.data(), t.name.size() + 1);
      for (int64_t d : t.shape) mix(&model_hash, &d, sizeof d);
      mix(&model_hash, &t.offset, sizeof t.offset);
      const uint8_t wd = t.weight_decay;
      mix(&model_hash, &wd, 1);
      mix(&model_hash, &t.group, sizeof t.group);
    }
  }
  for (const ScheduleEntry& e : ctx.opt.schedule) {
    mix(&schedule_hash, &e.block, sizeof e.block);
    const uint8_t pass = uint8_t(e.pass);
    mix(&schedule_hash, &pass, 1);
  }
  return {model_hash, schedule_hash};
}

}  // namespace

Status EnqueueWidenBf16Grad(Device& dev, void* buf, uint64_t n) {
  // Widen in place from the last value down: value i's fp32 bytes [4i, 4i+4) hold bf16
  // values 2i and 2i+1, both already read. Exact (a bf16 is the top half of an fp32).
  return dev.EnqueueHostFunction(
      Lane::kD2H,
      [buf, n] {
        const uint16_t* in = static_cast<const uint16_t*>(buf);
        float* out = static_cast<float*>(buf);
        for (uint64_t i = n; i-- > 0;) {
          const uint32_t bits = uint32_t{in[i]} << 16;
          std::memcpy(&out[i], &bits, 4);
        }
        return Status::OK();
      },
      "widen bf16 grad");
}

std::unique_ptr<Collectives> CreateCollectives(EngineContext& ctx, HostTier& host,
                                               DeviceTier& device, OptimizerStage& optimizer) {
  if (!ctx.comm) return std::make_unique<NoCollectives>(ctx, device);
  if (ctx.opt.collective_memory == CollectiveMemory::kDevice) {
    return CreateDeviceMemoryCollectives(ctx, host, device, optimizer);
  }
  return CreateHostMemoryCollectives(ctx, host, device, optimizer);
}

// Compares, across ranks, every option that fixes the order or the sizes of the collectives
// or changes the numbers (a rank with other optimizer settings would silently diverge):
// each rank contributes one fixed-size row of values; every rank finds the same first
// difference, so they all fail with the same message.
Status CheckOptionsAgreeAcrossRanks(const EngineContext& ctx) {
  const EngineOptions& opt = ctx.opt;
  const auto [model_hash, schedule_hash] = ModelAndScheduleHashes(ctx);
  const WorkingDtype dtype =
      opt.dtype != WorkingDtype::kAuto
          ? opt.dtype
          : (ctx.dev->Kind() == DeviceKind::kCuda ? WorkingDtype::kBf16 : WorkingDtype::kFp32);
  enum Shown : uint8_t { kNumber, kReal, kHash, kDtype, kMemory, kOptimizer, kGradDtype };
  struct Field {
    const char* name;
    uint64_t value;
    Shown shown;
  };
  auto real = [](double d) { return std::bit_cast<uint64_t>(d); };
  const Field fields[] = {
      {"the model (blocks, tensor names, shapes, weight decay, optimizer groups)", model_hash,
       kHash},
      {"tensor_alignment", opt.tensor_alignment, kNumber},
      {"schedule", schedule_hash, kHash},
      {"micro_batches", uint64_t(opt.micro_batches), kNumber},
      {"micro-batch order (0 batch, 1 layer)", uint64_t(opt.micro_batch_order), kNumber},
      {"device_mem_bytes (--device-mem)", opt.device_mem_bytes, kNumber},
      {"host_mem_bytes (--host-mem)", opt.host_mem_bytes, kNumber},
      {"the number of NVMe folders (--nvme)", opt.nvme_paths.size(), kNumber},
      {"durable", uint64_t(opt.durable), kNumber},
      {"resume", uint64_t(opt.resume), kNumber},
      {"working dtype", uint64_t(dtype), kDtype},
      {"collective memory", uint64_t(opt.collective_memory), kMemory},
      {"optimizer", uint64_t(opt.optimizer), kOptimizer},
      {"beta1", real(opt.beta1), kReal},
      {"beta2", real(opt.beta2), kReal},
      {"eps", real(opt.eps), kReal},
      {"weight_decay", real(opt.weight_decay), kReal},
      {"grad_clip", real(opt.grad_clip), kReal},
      {"speculation (0 auto, 1 on, 2 off)", uint64_t(opt.speculation), kNumber},
      {"gradients to NVMe (0 auto, 1 on, 2 off)", uint64_t(opt.grad_spill), kNumber},
      {"pipelined updates (--pipeline)", uint64_t(opt.pipeline_updates), kNumber},
      {"gradients device -> host (--grad-dtype)", uint64_t(opt.grad_dtype), kGradDtype},
      {"Adam moments' format (0 fp32, 1 bf16, 2 int8)", uint64_t(opt.state_format), kNumber},
      {"Adam moments' rounding (0 nearest-even, 1 stochastic)", uint64_t(opt.state_rounding),
       kNumber},
      {"master weights' format (0 fp32, 1 bf16-sr)", uint64_t(opt.master_format), kNumber},
  };
  constexpr size_t kFields = sizeof fields / sizeof fields[0];
  std::vector<uint64_t> mine(kFields), all(kFields * size_t(ctx.ws));
  for (size_t f = 0; f < kFields; ++f) mine[f] = fields[f].value;
  CollectiveOptions co;
  co.label = "all-gather engine options";
  STRATA_RETURN_IF_ERROR(
      ctx.host_comm->AllGather(mine.data(), all.data(), kFields * 8, CommDataType::kByte, co)
          .Wait()
          .Annotate("comparing the engine options of the ranks"));
  auto show = [&](const Field& f, uint64_t v) -> std::string {
    switch (f.shown) {
      case kNumber:
        return std::to_string(v);
      case kReal: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", std::bit_cast<double>(v));
        return buf;
      }
      case kHash: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "hash %016llx", static_cast<unsigned long long>(v));
        return buf;
      }
      case kDtype:
        return WorkingDtypeName(WorkingDtype(v));
      case kMemory:
        return CollectiveMemoryName(CollectiveMemory(v));
      case kOptimizer:
        return v == uint64_t(OptimizerKind::kAdamW) ? "adamw" : "adam";
      case kGradDtype:
        return GradDtypeName(GradDtype(v));
    }
    return "?";
  };
  // Every option that differs, each value with the ranks that have it.
  std::string diff;
  for (size_t f = 0; f < kFields; ++f) {
    const auto value = [&](int r) { return all[size_t(r) * kFields + f]; };
    const std::string d = DescribeRankDifference(fields[f].name, ctx.ws, value,
                                                 [&](int r) { return show(fields[f], value(r)); });
    if (!d.empty()) diff += (diff.empty() ? "" : "; ") + d;
  }
  if (!diff.empty()) {
    return Status::InvalidArgument(
        "the ranks' engine options differ: " + diff +
        "; every rank must run the same model with the same options (budgets included: they "
        "fix the order of the collectives)");
  }
  return Status::OK();
}

}  // namespace strata::engine_internal
