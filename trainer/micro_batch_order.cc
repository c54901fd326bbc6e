#include "trainer/micro_batch_order.h"

#include <algorithm>
#include <cstdio>

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

Result<OffloadActivations> ParseOffloadActivations(std::string_view text) {
  if (text == "auto") return OffloadActivations::kAuto;
  if (text == "on") return OffloadActivations::kOn;
  if (text == "off") return OffloadActivations::kOff;
  return Status::InvalidArgument("--offload-activations " + std::string(text) +
                                 ": expected auto, on or off");
}

const char* OffloadActivationsName(OffloadActivations choice) {
  switch (choice) {
    case OffloadActivations::kAuto:
      return "auto";
    case OffloadActivations::kOn:
      return "on";
    case OffloadActivations::kOff:
      return "off";
  }
  return "?";
}

MicroBatchCap OffloadedMicroBatchCap(const PlacementReport& placement, int device_slots,
                                     int keys_per_micro_batch) {
  MicroBatchCap cap;
  cap.activation_bytes = placement.activation_slot_bytes;
  cap.keys_per_micro_batch = keys_per_micro_batch;
  cap.device_slots = device_slots;
  cap.nvme = placement.nvme_folders > 0 || placement.activation_nvme_capacity > 0;
  if (placement.activation_host_capacity < 0) {
    cap.max = cap.activations = -1;
    cap.bound = "unbounded";
    return cap;
  }
  const bool nvme = placement.activation_nvme_capacity > placement.activation_host_capacity;
  cap.bound = nvme ? "nvme" : "host";
  cap.activations =
      std::max(placement.activation_host_capacity, placement.activation_nvme_capacity);
  // At least two micro-batches share the offloaded slot (micro-batches S-1..M-1).
  const int64_t shared = keys_per_micro_batch > 0 ? cap.activations / keys_per_micro_batch : 0;
  cap.max = shared >= 2 ? int64_t(device_slots) - 1 + shared : 1;
  return cap;
}

std::string MicroBatchCap::ToString() const {
  if (bound == "unbounded") {
    return "no budget bounds the micro-batches: without --host-mem every offloaded activation "
           "stays in host memory";
  }
  if (bound.empty()) return "";
  const int on_device = std::max(device_slots - 1, 0);
  const std::string acts =
      std::to_string(activations) + " activations of " + FormatBytes(activation_bytes) + " (" +
      std::to_string(keys_per_micro_batch) + " per offloaded micro-batch" +
      (on_device ? "; " + std::to_string(on_device) + " more keep theirs on the device" : "") + ")";
  const std::string out = "at most " + std::to_string(max) + " micro-batches: ";
  if (bound == "nvme") {
    return out + "the --nvme folders' free space holds " + acts +
           " (bound: nvme); free space there or add --nvme folders on other drives for more";
  }
  return out + "--host-mem holds " + acts + " beside the states (bound: host); raise --host-mem" +
         (nvme ? "" : " or give --nvme folders") + " for more";
}

double RecomputeSeconds(double block_forward_seconds, int layers, int micro_batches) {
  return block_forward_seconds * std::max(layers - 1, 0) * std::max(micro_batches, 0);
}

namespace {

Result<OrderedEngine> BatchMajor(const std::vector<BlockSpec>& specs, const EngineOptions& options,
                                 const MicroBatchOrderInputs& in, std::string reason) {
  OrderedEngine out;
  EngineOptions eo = options;
  eo.micro_batch_order = MicroBatchOrder::kBatchMajor;
  STRATA_ASSIGN_OR_RETURN(out.engine, Engine::Create(specs, eo));
  out.engine_device_bytes = eo.device_mem_bytes;
  out.recompute = in.recompute;
  out.reason = std::move(reason);
  return out;
}

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

// Batch-major's weight and gradient bytes beyond layer-major's (`p` is layer-major's
// engine, which sees one micro-batch's transfers): the weights once more per micro-batch and,
// on one rank, the gradient (layer-major sums the micro-batches on the device).
EdgeBytes BatchMajorExtraBytes(const PlacementReport& p, const MicroBatchOrderInputs& in, int M) {
  EdgeBytes extra;
  extra.h2d = SaturatingMul(uint64_t(M - 1), p.predicted_bytes.h2d);
  extra.d2h = in.multi_rank ? 0 : SaturatingMul(uint64_t(M - 1), p.predicted_bytes.d2h);
  return extra;
}

// Seconds the bytes take at the engine's expected link bandwidths.
double LinkSeconds(const EngineOptions& options, uint64_t h2d, uint64_t d2h) {
  return double(h2d) / options.ExpectedH2dBps() + double(d2h) / options.ExpectedD2hBps();
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

// Under auto, layer-major that needs --recompute turned on pays a forward per recomputed
// block and micro-batch (and `act_h2d`/`act_d2h` of offloaded activations) to save
// batch-major's weight and gradient traffic. Why batch-major is faster, or "" where layer-major
// is (or it cannot be weighed, or --recompute is not auto's to turn on).
std::string RecomputeCostsMore(const EngineOptions& options, const MicroBatchOrderInputs& in,
                               const PlacementReport& layer_major, uint64_t act_h2d,
                               uint64_t act_d2h) {
  if (in.choice != MicroBatchOrderChoice::kAuto || in.recompute || !in.recompute_auto ||
      !in.recompute_seconds || in.offload == OffloadActivations::kOn) {
    return "";
  }
  const EdgeBytes saved = BatchMajorExtraBytes(layer_major, in, options.micro_batches);
  const double saved_s = LinkSeconds(options, saved.h2d, saved.d2h);
  const double act_s = LinkSeconds(options, act_h2d, act_d2h);
  if (*in.recompute_seconds + act_s < saved_s) return "";
  return "layer-major needs --recompute, whose extra forward (" + Seconds(*in.recompute_seconds) +
         " a step, predicted from this machine's GEMMs)" +
         (act_s > 0 ? " and offloaded activations (" + Seconds(act_s) + ")" : std::string()) +
         " take longer than batch-major's " + FormatBytes(saved.h2d + saved.d2h) +
         " more weight and gradient bytes (" + Seconds(saved_s) +
         " at the expected link bandwidth); --recompute or --micro-batch-order layer "
         "choose layer-major";
}

std::string MoreMicroBatches(int n) {
  return std::to_string(n) + (n == 1 ? " more micro-batch" : " more micro-batches");
}

// Layer-major on one rank: the model sums the micro-batches on the device, and the engine
// sees one gradient per step. With ranks each micro-batch's gradient lands on its own.
bool LayerMajorSumsOnDevice(const MicroBatchOrderInputs& in) { return !in.multi_rank; }

// The engine options of layer-major order.
EngineOptions LayerMajorOptions(const EngineOptions& options, const MicroBatchOrderInputs& in) {
  EngineOptions eo = options;
  eo.micro_batch_order = MicroBatchOrder::kLayerMajor;
  if (LayerMajorSumsOnDevice(in)) {
    eo.micro_batches = 1;  // the model sums the micro-batches on the device
    eo.micro_batch_order = MicroBatchOrder::kBatchMajor;
  }
  return eo;
}

OrderedEngine LayerMajorResult(std::unique_ptr<Engine> engine, const EngineOptions& eo,
                               const MicroBatchOrderInputs& in, bool recompute) {
  OrderedEngine out;
  out.engine = std::move(engine);
  out.order = MicroBatchOrder::kLayerMajor;
  out.accumulate_on_device = LayerMajorSumsOnDevice(in);
  out.engine_device_bytes = eo.device_mem_bytes;
  out.recompute = recompute;
  return out;
}

std::string LayerMajorPrefix(const MicroBatchOrderInputs& in) {
  return std::string("layer-major") +
         (in.choice == MicroBatchOrderChoice::kLayer ? " (--micro-batch-order layer)" : "") +
         ": each block's params cross once per pass, " +
         (in.multi_rank ? "its gradient lands per micro-batch (averaged over the ranks)"
                        : "its gradient once per step");
}

// Every micro-batch's activations on the device (`per` bytes each): the engine gets the
// rest of --device-mem. nullptr with *refused set when they do not fit.
Result<std::unique_ptr<Engine>> OnDevice(const std::vector<BlockSpec>& specs,
                                         const EngineOptions& options,
                                         const MicroBatchOrderInputs& in, uint64_t per,
                                         bool recompute, OrderedEngine* out, Status* refused) {
  const int M = options.micro_batches;
  const uint64_t extra = SaturatingMul(per, uint64_t(M - 1));
  const uint64_t budget = options.device_mem_bytes;  // 0: unlimited
  const std::string acts = "the activations of " + MoreMicroBatches(M - 1) + " in flight (" +
                           FormatBytes(extra) + (recompute ? ", with recompute" : "") + ")";
  EngineOptions eo = LayerMajorOptions(options, in);
  if (budget != 0 && extra >= budget) {
    *refused = Status::OutOfMemory(acts + " take all of --device-mem " + FormatBytes(budget));
    return std::unique_ptr<Engine>();
  }
  if (budget == 0 && in.unlimited_room_bytes != 0 && extra > in.unlimited_room_bytes) {
    *refused = Status::OutOfMemory(acts + " exceed the " + FormatBytes(in.unlimited_room_bytes) +
                                   " the device has left for them");
    return std::unique_ptr<Engine>();
  }
  if (budget != 0) eo.device_mem_bytes = budget - extra;
  auto made = Engine::Create(specs, eo);
  if (!made.ok()) {
    if (made.status().code() != StatusCode::kOutOfMemory) return made.status();
    *refused = Status(made.status())
                   .Annotate("with " + acts + " taken from --device-mem " + FormatBytes(budget));
    return std::unique_ptr<Engine>();
  }
  *out = LayerMajorResult(std::move(*made), eo, in, recompute);
  out->activation_bytes = extra;
  out->reason = LayerMajorPrefix(in) + "; " + acts +
                (budget ? " leave the engine " + FormatBytes(eo.device_mem_bytes) +
                              " of --device-mem " + FormatBytes(budget)
                        : std::string(" on a device without a --device-mem cap"));
  return std::move(out->engine);
}

// The engine for S activation slots: micro-batches S-1..M-1 share the last, their activations
// in the engine.
Result<std::unique_ptr<Engine>> OffloadedEngine(const std::vector<BlockSpec>& specs,
                                                const EngineOptions& options,
                                                const MicroBatchOrderInputs& in, int slots,
                                                uint64_t per) {
  const int M = options.micro_batches;
  EngineOptions eo = LayerMajorOptions(options, in);
  if (options.device_mem_bytes != 0) eo.device_mem_bytes -= per * uint64_t(slots - 1);
  eo.activation_bytes = in.offload_shape.key_bytes;
  eo.activation_count = (M - slots + 1) * in.offload_shape.keys_per_micro_batch;
  return Engine::Create(specs, eo);
}

// The activation slots beyond the shared one that the device has room for beside the
// engine's minimum (`placement`'s), at `per` bytes each.
int DeviceRoomSlots(const PlacementReport& placement, const EngineOptions& options,
                    const MicroBatchOrderInputs& in, uint64_t per) {
  const uint64_t budget = options.device_mem_bytes;
  const uint64_t room =
      budget != 0 ? budget - std::min(budget, placement.device_min_bytes) : in.unlimited_room_bytes;
  return int(std::min<uint64_t>(INT32_MAX / 2, per ? room / per : 0));
}

// The one-slot engine, which offloads all M micro-batches' activations, was refused for lack
// of memory (`*refused` says why); with S device slots only M-S+1 of them are offloaded. An
// engine of two micro-batches says how many the budgets admit: it is returned when M is
// within that (the caller then makes the engine of S slots); else nullptr, with *refused
// naming the most and the budget to raise, or that as an error when the user asked for
// offloaded activations or layer-major (under auto, batch-major runs instead).
Result<std::unique_ptr<Engine>> ProbeTwoMicroBatches(const std::vector<BlockSpec>& specs,
                                                     const EngineOptions& options,
                                                     const MicroBatchOrderInputs& in, uint64_t per,
                                                     Status* refused) {
  EngineOptions two = options;
  two.micro_batches = 2;
  auto probe = OffloadedEngine(specs, two, in, 1, per);
  if (!probe.ok()) return std::unique_ptr<Engine>();  // not the micro-batch count
  const PlacementReport& p = (*probe)->Placement();
  const MicroBatchCap cap = OffloadedMicroBatchCap(p, 1 + DeviceRoomSlots(p, options, in, per),
                                                   in.offload_shape.keys_per_micro_batch);
  const int M = options.micro_batches;
  if (cap.max < 0 || M <= cap.max) return std::move(*probe);
  const Status why = Status::OutOfMemory("--micro-batches " + std::to_string(M) +
                                         " is more than the budgets admit with the "
                                         "activations offloaded: " +
                                         cap.ToString());
  if (in.offload == OffloadActivations::kOn || in.choice == MicroBatchOrderChoice::kLayer) {
    return why;
  }
  *refused = why;
  return std::unique_ptr<Engine>();
}

// Layer-major with the micro-batches the device has no room for sharing one slot. nullptr
// with *refused set when it does not fit, or (auto) moves more bytes than batch-major; with
// *slower set when (auto) the recompute it turns on costs more time than batch-major's bytes.
Result<std::unique_ptr<Engine>> Offloaded(const std::vector<BlockSpec>& specs,
                                          const EngineOptions& options,
                                          const MicroBatchOrderInputs& in, OrderedEngine* out,
                                          Status* refused, std::string* slower) {
  const int M = options.micro_batches;
  const bool recompute = in.recompute || in.recompute_auto;
  if (in.offload_shape.key_bytes == 0) {
    *refused = Status::NotSupported("the model cannot share an activation slot");
    return std::unique_ptr<Engine>();
  }
  if (!recompute) {
    *refused = Status::NotSupported(
        "offloading activations needs --recompute (only block "
        "inputs can be offloaded)");
    return std::unique_ptr<Engine>();
  }
  const uint64_t per =
      in.recompute ? in.saved_activation_bytes : in.saved_activation_bytes_recompute;
  // One slot first: the engine's device minimum says how many more the budget holds.
  auto one = OffloadedEngine(specs, options, in, 1, per);
  std::unique_ptr<Engine> engine;
  const bool probed = !one.ok();  // then `engine` is two micro-batches' (remade below)
  if (probed) {
    if (one.status().code() != StatusCode::kOutOfMemory) return one.status();
    *refused = Status(one.status()).Annotate("with the activations offloaded");
    STRATA_ASSIGN_OR_RETURN(engine, ProbeTwoMicroBatches(specs, options, in, per, refused));
    if (!engine) return engine;
  } else {
    engine = std::move(*one);
  }
  const PlacementReport& p = engine->Placement();
  const uint64_t budget = options.device_mem_bytes;
  const int room_slots = DeviceRoomSlots(p, options, in, per);
  const int slots = 1 + std::min(M - 2, room_slots);
  const MicroBatchCap cap =
      OffloadedMicroBatchCap(p, 1 + room_slots, in.offload_shape.keys_per_micro_batch);
  // What batch-major would move on top, against the offloaded micro-batches' activations.
  const EdgeBytes extra = BatchMajorExtraBytes(p, in, M);
  const uint64_t batch_extra = extra.h2d + extra.d2h;
  const uint64_t moved = uint64_t(M - slots + 1);
  const uint64_t d2h = moved * in.offload_shape.d2h_bytes_per_micro_batch;
  const uint64_t h2d = moved * in.offload_shape.h2d_bytes_per_micro_batch;
  const std::string counts = "activations of " + std::to_string(moved) + " of " +
                             std::to_string(M) + " micro-batches offloaded (" +
                             FormatBytes(d2h + h2d) + " per step out and back) vs batch-major's " +
                             FormatBytes(batch_extra) + " more weight and gradient bytes";
  if (in.offload == OffloadActivations::kAuto && d2h + h2d >= batch_extra) {
    *refused = Status::OutOfMemory(counts + ": batch-major moves fewer bytes");
    return std::unique_ptr<Engine>();
  }
  *slower = RecomputeCostsMore(options, in, p, h2d, d2h);
  if (!slower->empty()) return std::unique_ptr<Engine>();
  if (slots > 1 || probed) {
    engine.reset();  // its pinned memory and swap files go before the next engine's
    STRATA_ASSIGN_OR_RETURN(engine, OffloadedEngine(specs, options, in, slots, per));
  }
  EngineOptions eo = LayerMajorOptions(options, in);
  if (budget != 0) eo.device_mem_bytes = budget - per * uint64_t(slots - 1);
  *out = LayerMajorResult(nullptr, eo, in, true);
  out->activation_slots = slots;
  out->activation_bytes = per * uint64_t(slots - 1);
  out->offloaded_d2h_bytes = d2h;
  out->offloaded_h2d_bytes = h2d;
  out->batch_major_extra_bytes = batch_extra;
  out->max_micro_batches = cap;
  out->reason =
      LayerMajorPrefix(in) + "; " + counts +
      (in.recompute ? "" : "; --recompute turned on (only block inputs offload)") +
      (slots > 1 ? "; " + MoreMicroBatches(slots - 1) +
                       (slots == 2 ? " keeps its" : " keep their") + " activations on the device"
                 : "");
  return engine;
}

}  // namespace

Result<OrderedEngine> CreateOrderedEngine(const std::vector<BlockSpec>& specs,
                                          const EngineOptions& options,
                                          const MicroBatchOrderInputs& in) {
  const int M = options.micro_batches;
  const bool forced = in.choice == MicroBatchOrderChoice::kLayer;
  if (M <= 1) return BatchMajor(specs, options, in, "one micro-batch per step");
  if (in.choice == MicroBatchOrderChoice::kBatch) {
    return BatchMajor(specs, options, in, "batch-major (--micro-batch-order batch)");
  }
  if (options.grad_dtype == GradDtype::kBf16 && LayerMajorSumsOnDevice(in)) {
    // The model would sum the micro-batches into the gradient buffer, which bf16 gradients
    // leave packed as bf16 after each. (With ranks each micro-batch's gradient lands and is
    // reduce-scattered on its own: bf16 works there.)
    const std::string why =
        "with --grad-dtype bf16 the model cannot sum micro-batches on the "
        "device";
    if (forced) return Status::NotSupported("--micro-batch-order layer: " + why);
    return BatchMajor(specs, options, in, "batch-major: " + why);
  }
  OrderedEngine out;
  Status refused;
  std::string slower;  // auto: the recompute layer-major needs costs more than it saves
  if (in.offload != OffloadActivations::kOn) {
    // Every micro-batch's activations on the device: as given, or (auto) without recompute,
    // then with it.
    std::vector<std::pair<bool, uint64_t>> tries = {{in.recompute, in.saved_activation_bytes}};
    if (in.recompute_auto && !in.recompute) {
      tries.push_back({true, in.saved_activation_bytes_recompute});
    }
    for (const auto& [recompute, per] : tries) {
      Status why;
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                              OnDevice(specs, options, in, per, recompute, &out, &why));
      if (e && recompute && !in.recompute) {
        slower = RecomputeCostsMore(options, in, e->Placement(), 0, 0);
        if (!slower.empty()) break;  // offloading would need the recompute too
      }
      if (e) {
        out.engine = std::move(e);
        if (recompute && !in.recompute) out.reason += "; --recompute turned on to fit them";
        return out;
      }
      if (refused.ok()) refused = why;
    }
  }
  if (slower.empty() && in.offload != OffloadActivations::kOff) {
    Status why;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                            Offloaded(specs, options, in, &out, &why, &slower));
    if (e) {
      out.engine = std::move(e);
      return out;
    }
    if (!why.ok()) {
      refused =
          refused.ok() ? why : Status(refused.code(), refused.message() + "; " + why.message());
    }
  }
  if (!slower.empty()) return BatchMajor(specs, options, in, "batch-major: " + slower);
  if (forced) {
    return Status::OutOfMemory("--micro-batch-order layer: " + refused.message() +
                               "; raise --device-mem, add --recompute, lower --batch or "
                               "--micro-batches, or use --micro-batch-order batch");
  }
  return BatchMajor(specs, options, in,
                    "batch-major: layer-major does not fit: " + refused.message());
}

}  // namespace strata::trainer
