#include "trainer/micro_batch_order.h"

#include "strata/bytes.h"

namespace strata::trainer {

Result<MicroBatchOrderChoice> ParseMicroBatchOrder(std::string_view text) {
  if (text == "auto") return MicroBatchOrderChoice::kAuto;
  if (text == "layer") return MicroBatchOrderChoice::kLayer;
  if (text == "batch") return MicroBatchOrderChoice::kBatch;
  return Status::InvalidArgument("--micro-batch-order " + std::string(text) +
                                 ": expected auto, layer or batch");
}

const char* MicroBatchOrderChoiceName(MicroBatchOrderChoice choice) {
  switch (choice) {
    case MicroBatchOrderChoice::kAuto:
      return "auto";
    case MicroBatchOrderChoice::kLayer:
      return "layer";
    case MicroBatchOrderChoice::kBatch:
      return "batch";
  }
  return "?";
}

namespace {

Result<OrderedEngine> BatchMajor(const std::vector<BlockSpec>& specs, const EngineOptions& options,
                                 std::string reason) {
  OrderedEngine out;
  EngineOptions eo = options;
  eo.micro_batch_order = MicroBatchOrder::kBatchMajor;
  STRATA_ASSIGN_OR_RETURN(out.engine, Engine::Create(specs, eo));
  out.engine_device_bytes = eo.device_mem_bytes;
  out.reason = std::move(reason);
  return out;
}

}  // namespace

Result<OrderedEngine> CreateOrderedEngine(const std::vector<BlockSpec>& specs,
                                          const EngineOptions& options,
                                          const MicroBatchOrderInputs& in) {
  const int M = options.micro_batches;
  const bool forced = in.choice == MicroBatchOrderChoice::kLayer;
  if (M <= 1) return BatchMajor(specs, options, "one micro-batch per step");
  if (in.choice == MicroBatchOrderChoice::kBatch) {
    return BatchMajor(specs, options, "batch-major (--micro-batch-order batch)");
  }
  if (!in.model_has_slots) {
    const std::string why = "the CUDA model keeps one micro-batch's activations";
    if (forced) return Status::NotSupported("--micro-batch-order layer: " + why);
    return BatchMajor(specs, options, "batch-major: " + why);
  }
  if (options.grad_dtype == GradDtype::kBf16 && !in.multi_rank) {
    // One rank, layer-major: the model would sum the micro-batches into the gradient buffer,
    // which bf16 gradients leave packed as bf16 after each.
    const std::string why =
        "with --grad-dtype bf16 the model cannot sum micro-batches on the "
        "device";
    if (forced) return Status::NotSupported("--micro-batch-order layer: " + why);
    return BatchMajor(specs, options, "batch-major: " + why);
  }
  // Saturating: a product past 64 bits cannot fit any budget anyway.
  const uint64_t per = in.saved_activation_bytes;
  const uint64_t extra = per > UINT64_MAX / uint64_t(M - 1) ? UINT64_MAX : per * uint64_t(M - 1);
  const uint64_t budget = options.device_mem_bytes;  // 0: unlimited
  const std::string acts = "the activations of " + std::to_string(M - 1) +
                           (M == 2 ? " more micro-batch" : " more micro-batches") + " in flight (" +
                           FormatBytes(extra) + ")";
  EngineOptions eo = options;
  eo.micro_batch_order = MicroBatchOrder::kLayerMajor;
  if (!in.multi_rank) {
    eo.micro_batches = 1;  // the model sums the micro-batches on the device
    eo.micro_batch_order = MicroBatchOrder::kBatchMajor;
  }
  Status refused;
  if (budget != 0 && extra >= budget) {
    refused = Status::OutOfMemory(acts + " take all of --device-mem " + FormatBytes(budget));
  } else if (budget == 0 && in.unlimited_room_bytes != 0 && extra > in.unlimited_room_bytes) {
    refused = Status::OutOfMemory(acts + " exceed the " + FormatBytes(in.unlimited_room_bytes) +
                                  " the device has left for them");
  } else {
    if (budget != 0) eo.device_mem_bytes = budget - extra;
    auto made = Engine::Create(specs, eo);
    if (made.ok()) {
      OrderedEngine out;
      out.engine = std::move(*made);
      out.order = MicroBatchOrder::kLayerMajor;
      out.accumulate_on_device = !in.multi_rank;
      out.engine_device_bytes = eo.device_mem_bytes;
      out.activation_bytes = extra;
      out.reason = std::string("layer-major") + (forced ? " (--micro-batch-order layer)" : "") +
                   ": each block's params cross once per pass, " +
                   (in.multi_rank ? "its gradient lands per micro-batch (averaged over the ranks)"
                                  : "its gradient once per step") +
                   "; " + acts +
                   (budget ? " leave the engine " + FormatBytes(eo.device_mem_bytes) +
                                 " of --device-mem " + FormatBytes(budget)
                           : std::string(" on a device without a --device-mem cap"));
      return out;
    }
    if (made.status().code() != StatusCode::kOutOfMemory) return made.status();
    refused = Status(made.status())
                  .Annotate("with " + acts + " taken from --device-mem " + FormatBytes(budget));
  }
  if (forced) {
    return Status::OutOfMemory("--micro-batch-order layer: " + refused.message() +
                               "; raise --device-mem, add --recompute, lower --batch or "
                               "--micro-batches, or use --micro-batch-order batch");
  }
  return BatchMajor(specs, options, "batch-major: layer-major does not fit: " + refused.message());
}

}  // namespace strata::trainer
