// The order a training step runs its micro-batches in, chosen before the engine is made.
//
//   batch-major: each micro-batch runs forward and backward through every block in turn; a
//     block's parameters cross to the device once per pass per micro-batch and its gradient
//     crosses back once per micro-batch (accumulated on the host).
//   layer-major: every micro-batch runs through a block before the next block (forward and
//     backward), so a block's parameters cross once per pass. On one rank the model adds each
//     micro-batch's gradient into the engine's device buffer (the engine sees one
//     micro-batch), so a gradient crosses to the host once per step; across ranks each
//     micro-batch's gradient is still averaged over the ranks and lands on its own (the
//     engine's layer-major schedule), since averaging the sum would round differently.
// Both give the same bits: each block's gradient is the same fp32 sum over micro-batches in
// micro-batch order.
//
// What layer-major costs is the activations of every micro-batch in flight: (M-1) more
// micro-batches' saved activations (model::SavedActivationBytes: the block inputs with
// --recompute, every saved activation without). Kept on the device they count in the device
// budget: the engine gets --device-mem minus them. Where they do not fit, the micro-batches
// beyond the slots the device has room for share one slot and their activations live in the
// engine (activation_offload.h; pinned host or NVMe, as its planner places them), which
// costs one residual stream's copy out and back per block and micro-batch instead of a
// block's weights per micro-batch. `auto` picks, in order: layer-major with the activations
// on the device (turning --recompute on when it was not given and that makes them fit);
// layer-major with activations offloaded when that moves fewer bytes than batch-major's
// weight reloads (counting both; --offload-activations on/off forces it); else batch-major,
// saying why. Where layer-major needs --recompute turned on, bytes are not the whole cost:
// the recompute is another forward. With a predicted recompute time (the host device, where
// a weight reload is a memcpy and the recompute a third more compute), auto turns it on only
// when it costs less time than the weight traffic it saves.
//
// Plain functions; the engine made here belongs to the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/gpt2.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::trainer {

enum class MicroBatchOrderChoice : uint8_t { kAuto, kLayer, kBatch };

// --micro-batch-order: auto, layer or batch. InvalidArgument "--micro-batch-order <text>:
// expected auto, layer or batch".
Result<MicroBatchOrderChoice> ParseMicroBatchOrder(std::string_view text);
const char* MicroBatchOrderChoiceName(MicroBatchOrderChoice choice);

// --offload-activations: auto, on or off. InvalidArgument naming the text otherwise.
enum class OffloadActivations : uint8_t { kAuto, kOn, kOff };
Result<OffloadActivations> ParseOffloadActivations(std::string_view text);
const char* OffloadActivationsName(OffloadActivations choice);

struct MicroBatchOrderInputs {
  MicroBatchOrderChoice choice = MicroBatchOrderChoice::kAuto;
  int micro_batches = 1;
  // One micro-batch's saved activations on the device (model::SavedActivationBytes) with
  // `recompute` as given.
  uint64_t saved_activation_bytes = 0;
  bool recompute = false;
  // --recompute was not given: layer-major may turn it on where that lets the activations fit
  // (saved_activation_bytes_recompute then) or lets them be offloaded.
  bool recompute_auto = false;
  uint64_t saved_activation_bytes_recompute = 0;
  // Offloaded activations (needs recompute and a model whose slots can be shared; a zero
  // key_bytes: not possible).
  OffloadActivations offload = OffloadActivations::kAuto;
  model::OffloadedActivationShape offload_shape;
  // Several ranks: gradients are averaged per micro-batch, so they land per micro-batch.
  bool multi_rank = false;
  // Without a --device-mem cap: the memory the device has for layer-major's extra
  // activations (on the host device, what this host's memory leaves; 0: not known).
  uint64_t unlimited_room_bytes = 0;
  // What turning --recompute on adds to a step, predicted: one more forward of the
  // recomputed blocks per micro-batch (RecomputeSeconds). Under auto, layer-major that needs
  // --recompute turned on is taken only when this (plus any offloaded activations' traffic)
  // takes less time than batch-major's extra weight and gradient traffic at the engine's
  // expected link bandwidths. nullopt: not known (a GPU, where the link dominates); bytes
  // alone decide.
  std::optional<double> recompute_seconds;
};

// The predicted recompute cost: `block_forward_seconds` (one block's forward GEMMs for one
// micro-batch, timed) for each recomputed block (every block but the last, which keeps its
// activations) of each of `micro_batches`.
double RecomputeSeconds(double block_forward_seconds, int layers, int micro_batches);

// The most micro-batches the host and NVMe budgets admit with offloaded activations, from
// the engine's PlacementReport::activation_host_capacity / activation_nvme_capacity (the
// planner's and the stash's own byte model). Micro-batches beyond the device's slots each
// stash keys_per_micro_batch activations, at least two micro-batches share the last slot, and
// an activation count above the larger capacity is refused, so the most is
// (device_slots - 1) + floor(max(host, nvme) / keys_per_micro_batch).
struct MicroBatchCap {
  int64_t max = 0;  // -1: unbounded (no --host-mem: every activation stays in host memory)
  // "host" (--host-mem beside the states), "nvme" (the --nvme folders' free space),
  // "unbounded", or "" (activations not offloaded: no figure).
  std::string bound;
  int64_t activations = 0;        // the activations it admits (the larger capacity)
  uint64_t activation_bytes = 0;  // each (PlacementReport::activation_slot_bytes)
  int keys_per_micro_batch = 0;
  int device_slots = 0;  // the activation slots the device has room for
  bool nvme = false;     // the run has NVMe folders
  // "at most N micro-batches: ...; raise ... for more", for the start-up line and errors.
  std::string ToString() const;
};
MicroBatchCap OffloadedMicroBatchCap(const PlacementReport& placement, int device_slots,
                                     int keys_per_micro_batch);

// The engine made for the chosen order, and what the trainer needs to drive it.
struct OrderedEngine {
  std::unique_ptr<Engine> engine;
  MicroBatchOrder order = MicroBatchOrder::kBatchMajor;
  // Layer-major on one rank: the model accumulates the micro-batches' gradients in the
  // engine's device buffer (the engine was made with micro_batches 1).
  bool accumulate_on_device = false;
  // The engine's device budget: --device-mem less the activations layer-major adds (0:
  // unlimited).
  uint64_t engine_device_bytes = 0;
  uint64_t activation_bytes = 0;  // what layer-major adds to the device: (S-1) micro-batches
  bool recompute = false;         // resolved (recompute_auto may turn it on)
  // The model's activation slots: 0 = one per micro-batch; S < M: micro-batches S-1..M-1
  // share slot S-1 and their activations live in the engine (TrainOptions::activation_slots).
  int activation_slots = 0;
  // With offloaded activations: their bytes per step each way (model::OffloadedActivations),
  // and the weight and gradient bytes batch-major would have moved on top of layer-major's.
  uint64_t offloaded_d2h_bytes = 0, offloaded_h2d_bytes = 0, batch_major_extra_bytes = 0;
  // With offloaded activations: the most micro-batches the budgets admit (MicroBatchCap).
  MicroBatchCap max_micro_batches;
  std::string reason;  // one line for the start-up report
};

// Makes the engine for `options` (options.micro_batches is M) in the order `in` chooses.
// Errors: Engine::Create's; with --micro-batch-order layer, OutOfMemory naming the
// activations and the --device-mem that would fit, or NotSupported when the model cannot
// keep several micro-batches.
Result<OrderedEngine> CreateOrderedEngine(const std::vector<BlockSpec>& specs,
                                          const EngineOptions& options,
                                          const MicroBatchOrderInputs& in);

}  // namespace strata::trainer
