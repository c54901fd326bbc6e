#include "trainer/activation_offload.h"

#include <algorithm>

namespace strata::trainer {

using model::SlotTensor;

uint32_t SharedSlotWalk::Key(int micro, SlotTensor tensor, int index) const {
  int at = 0;
  switch (tensor) {
    case SlotTensor::kResidual:
      at = index;
      break;
    case SlotTensor::kResidualGrad:
      at = layers_ + 1;
      break;
    case SlotTensor::kHeadWteGrad:
      at = layers_ + 2 + index;
      break;
  }
  return static_cast<uint32_t>(micro) * static_cast<uint32_t>(shape_.keys_per_micro_batch) +
         static_cast<uint32_t>(at);
}

Status SharedSlotWalk::Stash(int micro, SlotTensor tensor, int index) {
  STRATA_ASSIGN_OR_RETURN(model::DeviceSpan span, backend_.SlotBuffer(slot_, tensor, index));
  STRATA_ASSIGN_OR_RETURN(
      EventPtr copied, engine_.StashActivation(Key(micro, tensor, index), span.data, span.bytes));
  // The next micro-batch's work overwrites the buffer.
  return device_.WaitEvent(Lane::kCompute, copied);
}

Status SharedSlotWalk::Fetch(int micro, SlotTensor tensor, int index, bool last) {
  STRATA_ASSIGN_OR_RETURN(model::DeviceSpan span, backend_.SlotBuffer(slot_, tensor, index));
  return engine_.FetchActivation(Key(micro, tensor, index), span.data, last);
}

Status SharedSlotWalk::StashWteGrad(int micro) {
  STRATA_ASSIGN_OR_RETURN(model::DeviceSpan span,
                          backend_.SlotBuffer(slot_, SlotTensor::kHeadWteGrad, 0));
  EventPtr copied;
  for (int i = 0; i < shape_.wte_grad_keys; ++i) {
    const uint64_t at = uint64_t(i) * shape_.key_bytes;
    const uint64_t n = std::min(shape_.key_bytes, span.bytes - at);
    STRATA_ASSIGN_OR_RETURN(copied, engine_.StashActivation(Key(micro, SlotTensor::kHeadWteGrad, i),
                                                            static_cast<char*>(span.data) + at, n));
  }
  return copied ? device_.WaitEvent(Lane::kCompute, copied) : Status::OK();
}

Status SharedSlotWalk::FetchWteGrad(int micro) {
  STRATA_ASSIGN_OR_RETURN(model::DeviceSpan span,
                          backend_.SlotBuffer(slot_, SlotTensor::kHeadWteGrad, 0));
  for (int i = 0; i < shape_.wte_grad_keys; ++i) {
    const uint64_t at = uint64_t(i) * shape_.key_bytes;
    STRATA_RETURN_IF_ERROR(engine_.FetchActivation(Key(micro, SlotTensor::kHeadWteGrad, i),
                                                   static_cast<char*>(span.data) + at,
                                                   /*last=*/true));
  }
  return Status::OK();
}

Status SharedSlotWalk::Forward(int block, int micro, const BlockView& view, const int32_t* inputs,
                               const int32_t* targets) {
  const int L = layers_;
  if (block == L + 1) return Status::OK();  // recomputed in backward
  STRATA_RETURN_IF_ERROR(backend_.UseSlot(slot_));
  if (block == 0) {
    STRATA_RETURN_IF_ERROR(backend_.SetTokens(inputs, targets));
  } else {
    STRATA_RETURN_IF_ERROR(Fetch(micro, SlotTensor::kResidual, block - 1, /*last=*/false));
  }
  STRATA_RETURN_IF_ERROR(backend_.Forward(block, view));
  return Stash(micro, SlotTensor::kResidual, block);
}

Status SharedSlotWalk::Backward(int block, int micro, const BlockView& view, float* grad,
                                float dloss, model::GradWrite write, const int32_t* inputs,
                                const int32_t* targets) {
  const int L = layers_;
  STRATA_RETURN_IF_ERROR(backend_.UseSlot(slot_));
  if (block == L + 1) {
    STRATA_RETURN_IF_ERROR(backend_.SetTokens(inputs, targets));
    STRATA_RETURN_IF_ERROR(Fetch(micro, SlotTensor::kResidual, L, /*last=*/true));
    // The final LayerNorm again: its output was overwritten by the micro-batches after this
    // one (same params, same input: the same values).
    STRATA_RETURN_IF_ERROR(backend_.Forward(block, view));
    STRATA_RETURN_IF_ERROR(backend_.Backward(block, view, grad, dloss, micro, write));
    STRATA_RETURN_IF_ERROR(Stash(micro, SlotTensor::kResidualGrad, 0));
    return StashWteGrad(micro);
  }
  if (block >= 1) {
    STRATA_RETURN_IF_ERROR(Fetch(micro, SlotTensor::kResidual, block - 1, /*last=*/true));
    STRATA_RETURN_IF_ERROR(Fetch(micro, SlotTensor::kResidualGrad, 0, /*last=*/true));
    STRATA_RETURN_IF_ERROR(backend_.Backward(block, view, grad, dloss, micro, write));
    return Stash(micro, SlotTensor::kResidualGrad, 0);
  }
  STRATA_RETURN_IF_ERROR(backend_.SetTokens(inputs, targets));
  STRATA_RETURN_IF_ERROR(Fetch(micro, SlotTensor::kResidualGrad, 0, /*last=*/true));
  STRATA_RETURN_IF_ERROR(FetchWteGrad(micro));
  return backend_.Backward(block, view, grad, dloss, micro, write);
}

}  // namespace strata::trainer
