// Typed messages over a communicator: the multi-rank protocols of the trainer (rank 0 shares
// what it alone read, every rank checks that the others agree) written as structs rather
// than raw byte or int arrays.
//
// A message is a trivially copyable struct sent as its bytes (CommDataType::kByte), so every
// rank must run the same build: the layout is the wire format. Every call is a collective:
// all ranks issue it, in the same order, with the same type. The communicator must take host
// buffers (Gloo); the label names the collective in observer records and errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "strata/comm.h"
#include "strata/status.h"

namespace strata {

template <typename T>
concept CommMessage = std::is_trivially_copyable_v<T>;

// Every rank's `mine`, in rank order. Errors: the all-gather's (Timeout/Comm naming the
// lost rank, Aborted on a broken communicator).
template <CommMessage T>
Result<std::vector<T>> AllGatherMessages(Communicator& comm, const T& mine,
                                         std::string_view label) {
  std::vector<T> all(static_cast<size_t>(comm.world_size()), mine);
  CollectiveOptions co;
  co.label = label;
  STRATA_RETURN_IF_ERROR(
      comm.AllGather(&mine, all.data(), sizeof(T), CommDataType::kByte, co).Wait());
  return all;
}

// What one rank did alone, sent to the others: the value, or that it failed.
template <CommMessage T>
struct RootOutcome {
  uint8_t ok = 0;  // 0: the root failed and `value` is meaningless
  T value{};
};

// Rank `root` shares the value it alone computed (nullopt: it failed; its own error is its
// business), and every rank returns the same: the value, or nullopt when the root failed.
// `value` is read on the root only. Errors: the broadcast's.
template <CommMessage T>
Result<std::optional<T>> ShareFromRoot(Communicator& comm, int root, const std::optional<T>& value,
                                       std::string_view label) {
  RootOutcome<T> msg;
  if (comm.rank() == root && value) {
    msg.ok = 1;
    msg.value = *value;
  }
  CollectiveOptions co;
  co.label = label;
  STRATA_RETURN_IF_ERROR(comm.Broadcast(&msg, sizeof msg, CommDataType::kByte, root, co).Wait());
  if (msg.ok == 0) return std::optional<T>();
  return std::optional<T>(msg.value);
}

// The resumed-step agreement: every rank must resume the same step, since each rank's swap
// store holds its own shard of one run. InvalidArgument naming the first rank that differs
// ("rank 1 resumes step 3 but this rank step 4; resume every rank from the same run (same
// world size)"); the all-gather's errors otherwise.
Status AgreeOnResumedStep(Communicator& comm, int64_t step);

// One option of a run as its flag and its value in words ("--batch", "8").
struct NamedValue {
  std::string name;
  std::string value;
};

// Checks that every rank runs with the same `mine` (the options that fix the order of the
// collectives or the numbers; the same names in the same order on every rank, as one build
// gives). InvalidArgument, the same on every rank, listing every option that differs with
// each value and the ranks that have it ("the ranks' <what> differ: --batch: 8 on ranks 0,
// 2 vs 4 on rank 1; --lr: ..."); values are shown up to 55 characters but compared whole (by
// hash). The all-gathers' errors otherwise.
Status CheckSameOnEveryRank(Communicator& comm, const std::vector<NamedValue>& mine,
                            std::string_view what);

}  // namespace strata
