// GPT-2 through the engine on CUDA: see gpt2_cuda_model.h. Compiled to a NotSupported stub
// without the CUDA model (model/cuda/).
#include "model/gpt2_cuda_model.h"

#ifdef STRATA_HAVE_MODEL_CUDA
#include <cuda_runtime.h>

#include "model/cuda/gpt2_cuda_block.h"
#include "model/cuda/gpt2_cuda_ops.h"
#endif

namespace strata::model {

#ifndef STRATA_HAVE_MODEL_CUDA

Result<std::unique_ptr<Gpt2CudaModel>> Gpt2CudaModel::Create(Device*, const Gpt2Config&, int, int,
                                                             bool, int, int) {
  return Status::NotSupported("this build has no CUDA model (built without CUDA)");
}

#else

namespace {

using cuda_ops::Bf16;
namespace co = cuda_ops;

class Gpt2CudaModelImpl : public Gpt2CudaModel {
 public:
  Gpt2CudaModelImpl(Device* device, const Gpt2Config& cfg, int B, int T, bool recompute)
      : device_(device), cfg_(cfg), B_(B), T_(T), recompute_(recompute) {}

  ~Gpt2CudaModelImpl() override {
    (void)device_->SynchronizeLane(Lane::kCompute);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (void* p : allocations_) (void)device_->Free(p);
  }

  Status Init(int micro_batches, int micro_slots) {
    STRATA_ASSIGN_OR_RETURN(ctx_, co::CudaOpContext::Create(static_cast<cudaStream_t>(
                                      device_->NativeStream(Lane::kCompute))));
    // The fused classifier runs over a vocabulary padded to a multiple of 128 (the tied head's
    // copy of wte has zero rows there, their logits are ignored and their gradients zero);
    // the naive one over the real V.
    fused_classifier_ = !ctx_->kernels().naive_classifier;
    Vp_ = fused_classifier_ ? co::PaddedVocab(cfg_.vocab) : cfg_.vocab;
    const size_t N = static_cast<size_t>(B_) * T_, C = cfg_.d_model, V = Vp_;
    shape_ = {B_, T_, cfg_.d_model, cfg_.heads};
    slots_.resize(static_cast<size_t>(micro_slots));
    for (Slot& sl : slots_) {
      STRATA_RETURN_IF_ERROR(Alloc(&sl.tokens, N * sizeof(int32_t)));
      STRATA_RETURN_IF_ERROR(Alloc(&sl.targets, N * sizeof(int32_t)));
      sl.xs.resize(cfg_.layers + 1);
      for (auto& x : sl.xs) STRATA_RETURN_IF_ERROR(Alloc(&x, N * C * sizeof(Bf16)));
      sl.acts.resize(recompute_ ? 0 : cfg_.layers);
      for (auto& a : sl.acts) STRATA_RETURN_IF_ERROR(AllocActivations(&a));
      STRATA_RETURN_IF_ERROR(Alloc(&sl.lnf, N * C * sizeof(Bf16)));
      STRATA_RETURN_IF_ERROR(Alloc(&sl.lnf_mean, N * sizeof(float)));
      STRATA_RETURN_IF_ERROR(Alloc(&sl.lnf_rstd, N * sizeof(float)));
      STRATA_RETURN_IF_ERROR(Alloc(&sl.dres, N * C * sizeof(Bf16)));
      STRATA_RETURN_IF_ERROR(Alloc(&sl.dwte_head, V * C * sizeof(float)));
    }
    cur_ = &slots_[0];
    if (recompute_) STRATA_RETURN_IF_ERROR(AllocActivations(&redo_));
    void* sbase = nullptr;
    STRATA_RETURN_IF_ERROR(Alloc(&sbase, co::BlockScratch::Bytes(shape_)));
    scratch_ = co::BlockScratch::Carve(sbase, shape_);
    // The ops' workspace now, not in the first step (an OutOfMemory belongs to start-up).
    STRATA_RETURN_IF_ERROR(
        ctx_->Workspace(co::ModelWorkspaceBytes(*ctx_, B_, T_, cfg_.d_model, cfg_.heads)).status());
    STRATA_RETURN_IF_ERROR(Alloc(&tmp_, N * C * sizeof(Bf16)));
    STRATA_RETURN_IF_ERROR(Alloc(&wte_copy_, V * C * sizeof(Bf16)));
    STRATA_RETURN_IF_ERROR(Zero(wte_copy_, V * C * sizeof(Bf16)));  // the padding rows
    STRATA_RETURN_IF_ERROR(Alloc(&logits_, N * V * sizeof(Bf16)));
    STRATA_RETURN_IF_ERROR(Alloc(&losses_, N * sizeof(float)));
    STRATA_RETURN_IF_ERROR(Alloc(&mean_losses_, static_cast<size_t>(micro_batches) * 4));
    STRATA_RETURN_IF_ERROR(Alloc(&dlnf_, N * C * sizeof(Bf16)));
    STRATA_RETURN_IF_ERROR(Alloc(&dx_, N * C * sizeof(Bf16)));
    loss_slots_ = micro_batches;
    return Status::OK();
  }

  int MicroSlots() const override { return static_cast<int>(slots_.size()); }
  Status UseSlot(int slot) override {
    STRATA_RETURN_IF_ERROR(CheckSlot(slot));
    cur_ = &slots_[static_cast<size_t>(slot)];
    return Status::OK();
  }

  Result<DeviceSpan> SlotBuffer(int slot, SlotTensor tensor, int index) override {
    STRATA_RETURN_IF_ERROR(CheckSlot(slot));
    const Slot& sl = slots_[static_cast<size_t>(slot)];
    const uint64_t NC = uint64_t(B_) * uint64_t(T_) * uint64_t(cfg_.d_model);
    switch (tensor) {
      case SlotTensor::kResidual:
        if (index < 0 || index > cfg_.layers) {
          return Status::InvalidArgument("residual " + std::to_string(index) +
                                         " out of range [0, " + std::to_string(cfg_.layers) + "]");
        }
        return DeviceSpan{sl.xs[static_cast<size_t>(index)], NC * sizeof(Bf16)};
      case SlotTensor::kResidualGrad:
        return DeviceSpan{sl.dres, NC * sizeof(Bf16)};
      case SlotTensor::kHeadWteGrad:
        // The real vocabulary's rows: only they are added to the embedding's gradient.
        return DeviceSpan{sl.dwte_head, uint64_t(cfg_.vocab) * uint64_t(cfg_.d_model) * 4};
    }
    return Status::InvalidArgument("unknown slot tensor");
  }

  Status SetTokens(const int32_t* inputs, const int32_t* targets) override {
    const size_t N = static_cast<size_t>(B_) * T_;
    cudaStream_t s = ctx_->stream();
    // Pageable copies are staged by the driver before returning, so the host buffers may be
    // reused at once; the stream orders them before the kernels.
    STRATA_RETURN_IF_ERROR(co::CudaStatus(
        cudaMemcpyAsync(cur_->tokens, inputs, N * sizeof(int32_t), cudaMemcpyHostToDevice, s),
        "copy tokens"));
    return co::CudaStatus(
        cudaMemcpyAsync(cur_->targets, targets, N * sizeof(int32_t), cudaMemcpyHostToDevice, s),
        "copy targets");
  }

  Status Forward(int b, const BlockView& v) override {
    STRATA_RETURN_IF_ERROR(StartTiming());
    Status st = ForwardWork(b, v);
    STRATA_RETURN_IF_ERROR(StopTiming());
    return st;
  }

  Status Backward(int b, const BlockView& v, float* g, float dloss, int micro,
                  GradWrite write) override {
    if (grad_dtype_ == GradDtype::kBf16 && write == GradWrite::kAccumulate) {
      return Status::NotSupported(
          "bf16 gradients with gradients accumulated on the device; use --micro-batch-order "
          "batch");
    }
    STRATA_RETURN_IF_ERROR(StartTiming());
    Status st = BackwardWork(b, v, g, dloss, micro, write);
    if (st.ok() && grad_dtype_ == GradDtype::kBf16) st = PackBf16(g, v.layout->padded_numel);
    STRATA_RETURN_IF_ERROR(StopTiming());
    return st;
  }

  double ComputeSeconds() const override { return compute_seconds_; }

  Status SetGradDtype(GradDtype dtype) override {
    grad_dtype_ = dtype;
    return Status::OK();
  }

  Status ForwardWork(int b, const BlockView& v) {
    const int L = cfg_.layers, N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab;
    cudaStream_t s = ctx_->stream();
    STRATA_RETURN_IF_ERROR(CheckView(v));
    const Bf16* p = static_cast<const Bf16*>(v.params);
    const BlockLayout& lay = *v.layout;
    auto P = [&](int t) { return p + lay.tensors[t].offset; };
    if (b == 0) {
      STRATA_RETURN_IF_ERROR(co::CudaStatus(
          cudaMemcpyAsync(wte_copy_, P(kWte), static_cast<size_t>(V) * C * sizeof(Bf16),
                          cudaMemcpyDeviceToDevice, s),
          "copy wte for the tied head"));
      return co::EmbeddingForward(*ctx_, X(0), cur_->tokens, P(kWte), P(kWpe), B_, T_, C);
    }
    if (b <= L) return LayerForward(b - 1, Params(p, lay));
    return co::LayerNormForward(*ctx_, cur_->lnf, cur_->lnf_mean, cur_->lnf_rstd, X(L), P(kLnfW),
                                P(kLnfB), N, C);
  }

  // The block's gradient into the engine's buffer `grad`: written there (kOverwrite), or
  // computed into a scratch buffer and then added to it (kAccumulate: the buffer holds the
  // earlier micro-batches' sum, and ((g0 + g1) + g2) ... is the engine's own order).
  Status BackwardWork(int b, const BlockView& v, float* grad, float dloss, int micro,
                      GradWrite write) {
    if (micro < 0 || micro >= loss_slots_) {
      return Status::InvalidArgument("micro-batch " + std::to_string(micro) + " out of range");
    }
    const size_t n = v.layout->padded_numel;
    float* g = grad;
    if (write == GradWrite::kAccumulate) {
      STRATA_ASSIGN_OR_RETURN(void* scratch, GradScratch(n * sizeof(float)));
      g = static_cast<float*>(scratch);
    }
    STRATA_RETURN_IF_ERROR(BlockBackwardInto(b, v, g, dloss, micro));
    return write == GradWrite::kAccumulate ? co::AccumulateF32(*ctx_, grad, g, n) : Status::OK();
  }

  Status BlockBackwardInto(int b, const BlockView& v, float* g, float dloss, int micro) {
    const int L = cfg_.layers, N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab;
    const size_t NC = static_cast<size_t>(N) * C;
    cudaStream_t s = ctx_->stream();
    STRATA_RETURN_IF_ERROR(CheckView(v));
    const Bf16* p = static_cast<const Bf16*>(v.params);
    const BlockLayout& lay = *v.layout;
    auto P = [&](int t) { return p + lay.tensors[t].offset; };
    auto G = [&](int t) { return g + lay.tensors[t].offset; };
    STRATA_RETURN_IF_ERROR(
        co::CudaStatus(cudaMemsetAsync(g, 0, lay.padded_numel * sizeof(float), s), "zero grads"));
    if (b == L + 1) {
      Bf16* logits = static_cast<Bf16*>(logits_);
      int32_t* targets = cur_->targets;
      STRATA_RETURN_IF_ERROR(
          co::LmHeadForward(*ctx_, logits, cur_->lnf, static_cast<Bf16*>(wte_copy_), N, C, Vp_));
      if (fused_classifier_) {
        STRATA_RETURN_IF_ERROR(co::FusedClassifier(
            *ctx_, logits, F32(losses_), F32(mean_losses_) + micro, targets, N, V, Vp_, dloss));
      } else {
        STRATA_RETURN_IF_ERROR(co::SoftmaxCrossEntropyForward(
            *ctx_, logits, F32(losses_), F32(mean_losses_) + micro, logits, targets, N, V));
        STRATA_RETURN_IF_ERROR(
            co::SoftmaxCrossEntropyBackward(*ctx_, logits, logits, targets, N, V, dloss));
      }
      STRATA_RETURN_IF_ERROR(Zero(dlnf_, NC * sizeof(Bf16)));
      STRATA_RETURN_IF_ERROR(Zero(cur_->dwte_head, static_cast<size_t>(Vp_) * C * sizeof(float)));
      STRATA_RETURN_IF_ERROR(co::LmHeadBackward(*ctx_, static_cast<Bf16*>(dlnf_), cur_->dwte_head,
                                                logits, cur_->lnf, static_cast<Bf16*>(wte_copy_), N,
                                                C, Vp_));
      STRATA_RETURN_IF_ERROR(Zero(cur_->dres, NC * sizeof(Bf16)));
      STRATA_RETURN_IF_ERROR(co::LayerNormBackward(*ctx_, cur_->dres, G(kLnfW), G(kLnfB),
                                                   static_cast<Bf16*>(dlnf_), X(L), P(kLnfW),
                                                   cur_->lnf_mean, cur_->lnf_rstd, N, C));
    } else if (b >= 1) {
      const int l = b - 1;
      const co::BlockParams bp = Params(p, lay);
      if (recompute_) STRATA_RETURN_IF_ERROR(LayerForward(l, bp));
      co::BlockGrads bg;
      bg.ln1_w = G(kLn1W), bg.ln1_b = G(kLn1B), bg.qkv_w = G(kAttnW), bg.qkv_b = G(kAttnB);
      bg.attn_proj_w = G(kAttnProjW), bg.attn_proj_b = G(kAttnProjB);
      bg.ln2_w = G(kLn2W), bg.ln2_b = G(kLn2B), bg.fc_w = G(kFcW), bg.fc_b = G(kFcB);
      bg.fc_proj_w = G(kFcProjW), bg.fc_proj_b = G(kFcProjB);
      // dx accumulates and must not alias dy: into dx_, then back into the slot's buffer (which
      // keeps one address for the slot's life: SlotBuffer).
      STRATA_RETURN_IF_ERROR(Zero(dx_, NC * sizeof(Bf16)));
      STRATA_RETURN_IF_ERROR(co::BlockBackward(*ctx_, shape_, bp, bg, X(l), Acts(l), cur_->dres,
                                               static_cast<Bf16*>(dx_), scratch_));
      STRATA_RETURN_IF_ERROR(co::CudaStatus(
          cudaMemcpyAsync(cur_->dres, dx_, NC * sizeof(Bf16), cudaMemcpyDeviceToDevice, s),
          "residual gradient into its slot"));
    } else {
      STRATA_RETURN_IF_ERROR(co::CudaStatus(
          cudaMemcpyAsync(G(kWte), cur_->dwte_head, static_cast<size_t>(V) * C * sizeof(float),
                          cudaMemcpyDeviceToDevice, s),
          "add the head's wte gradient"));
      STRATA_RETURN_IF_ERROR(
          co::EmbeddingBackward(*ctx_, G(kWte), G(kWpe), cur_->dres, cur_->tokens, B_, T_, C, V));
    }
    return Status::OK();
  }

  Result<std::vector<double>> Losses(int n) override {
    STRATA_RETURN_IF_ERROR(device_->SynchronizeLane(Lane::kCompute));
    std::vector<float> h(static_cast<size_t>(n));
    STRATA_RETURN_IF_ERROR(co::CudaStatus(
        cudaMemcpy(h.data(), mean_losses_, h.size() * 4, cudaMemcpyDeviceToHost), "read losses"));
    STRATA_RETURN_IF_ERROR(CollectTiming());
    return std::vector<double>(h.begin(), h.end());
  }

 private:
  Status Alloc(void** p, size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(*p, device_->Allocate(std::max<size_t>(bytes, 256)));
    allocations_.push_back(*p);
    return Status::OK();
  }
  template <typename T>
  Status Alloc(T** p, size_t bytes) {
    void* v = nullptr;
    STRATA_RETURN_IF_ERROR(Alloc(&v, bytes));
    *p = static_cast<T*>(v);
    return Status::OK();
  }
  // Compute time: a pair of CUDA events around each Forward/Backward call's work, recorded on
  // the compute stream after whatever wait for the engine's copies precedes it; the pairs are
  // read and summed once the lane is idle (Losses), and the pool is reused.
  Status StartTiming() {
    if (used_events_ + 2 > events_.size()) {
      for (int i = 0; i < 2; ++i) {
        cudaEvent_t e = nullptr;
        STRATA_RETURN_IF_ERROR(co::CudaStatus(cudaEventCreate(&e), "cudaEventCreate (timing)"));
        events_.push_back(e);
      }
    }
    return co::CudaStatus(cudaEventRecord(events_[used_events_++], ctx_->stream()),
                          "cudaEventRecord (timing)");
  }
  Status StopTiming() {
    return co::CudaStatus(cudaEventRecord(events_[used_events_++], ctx_->stream()),
                          "cudaEventRecord (timing)");
  }
  Status CollectTiming() {
    double ms_total = 0;
    for (size_t i = 0; i + 1 < used_events_; i += 2) {
      float ms = 0;
      STRATA_RETURN_IF_ERROR(co::CudaStatus(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]),
                                            "cudaEventElapsedTime"));
      ms_total += ms;
    }
    used_events_ = 0;
    compute_seconds_ = ms_total / 1e3;
    return Status::OK();
  }

  Status CheckSlot(int slot) const {
    if (slot >= 0 && slot < static_cast<int>(slots_.size())) return Status::OK();
    return Status::InvalidArgument("activation slot " + std::to_string(slot) +
                                   " out of range [0, " + std::to_string(slots_.size()) + ")");
  }
  Status AllocActivations(co::BlockActivations* a) {
    void* base = nullptr;
    STRATA_RETURN_IF_ERROR(Alloc(&base, co::BlockActivations::Bytes(shape_)));
    *a = co::BlockActivations::Carve(base, shape_);
    return Status::OK();
  }
  // Layer l's activations: the slot's own, or (recompute) the one set rebuilt in backward.
  const co::BlockActivations& Acts(int l) const {
    return recompute_ ? redo_ : cur_->acts[static_cast<size_t>(l)];
  }
  // A device buffer of at least `bytes` for a block's gradient on its way into the engine's
  // buffer: the micro-batch's own gradient that kAccumulate then adds, or the bf16 packing's
  // staging (never both in one Backward: bf16 with kAccumulate is refused). Work using it is
  // ordered on the compute stream, so one buffer serves every block.
  Result<void*> GradScratch(size_t bytes) {
    if (bytes > grad_scratch_bytes_) {
      // A larger block: a new buffer (queued work may still read the old one; both are freed
      // with the model).
      STRATA_RETURN_IF_ERROR(Alloc(&grad_scratch_, bytes));
      grad_scratch_bytes_ = bytes;
    }
    return grad_scratch_;
  }

  // grad[0, n) fp32 -> n bf16 at the start of the same buffer (through a scratch buffer: an
  // in-place conversion by parallel threads would overwrite values not yet read).
  Status PackBf16(float* grad, size_t n) {
    STRATA_ASSIGN_OR_RETURN(void* staging, GradScratch(n * sizeof(Bf16)));
    Bf16* scratch = static_cast<Bf16*>(staging);
    STRATA_RETURN_IF_ERROR(co::ConvertF32ToBf16(*ctx_, scratch, grad, n));
    return co::CudaStatus(
        cudaMemcpyAsync(grad, scratch, n * sizeof(Bf16), cudaMemcpyDeviceToDevice, ctx_->stream()),
        "pack bf16 gradient");
  }

  Status Zero(void* p, size_t bytes) {
    return co::CudaStatus(cudaMemsetAsync(p, 0, bytes, ctx_->stream()), "zero");
  }
  static float* F32(void* p) { return static_cast<float*>(p); }
  Bf16* X(int l) { return cur_->xs[static_cast<size_t>(l)]; }
  Status CheckView(const BlockView& v) const {
    if (v.dtype != WorkingDtype::kBf16) {
      return Status::NotSupported(std::string("the CUDA model computes in bf16; the engine's "
                                              "working dtype is ") +
                                  WorkingDtypeName(v.dtype));
    }
    return Status::OK();
  }
  static co::BlockParams Params(const Bf16* p, const BlockLayout& lay) {
    auto P = [&](int t) { return p + lay.tensors[t].offset; };
    co::BlockParams bp;
    bp.ln1_w = P(kLn1W), bp.ln1_b = P(kLn1B), bp.qkv_w = P(kAttnW), bp.qkv_b = P(kAttnB);
    bp.attn_proj_w = P(kAttnProjW), bp.attn_proj_b = P(kAttnProjB);
    bp.ln2_w = P(kLn2W), bp.ln2_b = P(kLn2B), bp.fc_w = P(kFcW), bp.fc_b = P(kFcB);
    bp.fc_proj_w = P(kFcProjW), bp.fc_proj_b = P(kFcProjB);
    return bp;
  }
  Status LayerForward(int l, const co::BlockParams& bp) {
    return co::BlockForward(*ctx_, shape_, bp, X(l), X(l + 1), static_cast<Bf16*>(tmp_), Acts(l));
  }

  Device* device_;
  Gpt2Config cfg_;
  int B_, T_;
  int Vp_ = 0;  // the logits' row length: V padded to 128 (fused classifier) or V
  bool fused_classifier_ = true;
  bool recompute_;
  int loss_slots_ = 0;  // micro-batches whose mean loss Backward may write
  std::unique_ptr<co::CudaOpContext> ctx_;
  co::BlockShape shape_;
  std::vector<void*> allocations_;
  std::vector<cudaEvent_t> events_;  // start/stop pairs, [0, used_events_) recorded this step
  size_t used_events_ = 0;
  double compute_seconds_ = 0;
  GradDtype grad_dtype_ = GradDtype::kFp32;
  void* grad_scratch_ = nullptr;  // GradScratch's buffer, grad_scratch_bytes_ long
  size_t grad_scratch_bytes_ = 0;
  // What one micro-batch keeps from its forward to its backward (and, in backward, from one
  // block to the next), as the CPU model's Slot (model/gpt2.cc) does: its tokens, the residual
  // stream, each layer's activations unless they are recomputed, the final LayerNorm, the
  // gradient flowing back and the head's wte gradient (added to the embedding's in its
  // backward). Layer-major order keeps several micro-batches in flight, one per slot.
  struct Slot {
    int32_t *tokens = nullptr, *targets = nullptr;
    std::vector<Bf16*> xs;                   // xs[l]: the input of layer l; xs[L]: of ln_f
    std::vector<co::BlockActivations> acts;  // one per layer; empty with recompute
    Bf16* lnf = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr;
    Bf16* dres = nullptr;        // the residual gradient flowing back
    float* dwte_head = nullptr;  // [Vp, C]
  };
  std::vector<Slot> slots_;
  Slot* cur_ = nullptr;          // the slot UseSlot chose
  co::BlockActivations redo_{};  // with recompute: the one layer's, rebuilt in backward
  co::BlockScratch scratch_{};
  void *tmp_ = nullptr, *wte_copy_ = nullptr, *logits_ = nullptr, *losses_ = nullptr;
  void *mean_losses_ = nullptr, *dlnf_ = nullptr, *dx_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Gpt2CudaModel>> Gpt2CudaModel::Create(Device* device,
                                                             const Gpt2Config& config, int B, int T,
                                                             bool recompute, int micro_batches,
                                                             int micro_slots) {
  if (device->Kind() != DeviceKind::kCuda) {
    return Status::InvalidArgument("Gpt2CudaModel needs a CUDA device, got " + device->Name());
  }
  if (micro_slots < 1) {
    return Status::InvalidArgument("micro_slots " + std::to_string(micro_slots) + " must be >= 1");
  }
  auto m = std::make_unique<Gpt2CudaModelImpl>(device, config, B, T, recompute);
  STRATA_RETURN_IF_ERROR(m->Init(micro_batches, micro_slots));
  return std::unique_ptr<Gpt2CudaModel>(std::move(m));
}

#endif  // STRATA_HAVE_MODEL_CUDA

}  // namespace strata::model
