// The stripe marker: "strata.stripe", a small file in every folder of a swap store that says
// which store the folder belongs to and where it stands in the stripe. The manifest lives in
// folder 0 alone, so without it a folder i > 0 (and folder 0 given in another place) would
// look empty: a fresh run would take it and destroy its part of the store, and a resume that
// names the folders in another order could only say "no store here".
//
// A marker holds the store's identity (random, made when the store is made), the run identity
// the store was made with (SwapStoreOptions::run_id), the folder's index and the number of
// folders, and every folder's absolute path when the store was made (to find the store's
// committed step from any of its folders, and to name the folders a command left out). It is text,
// sealed by the XXH3-64 of the text before the seal; a damaged marker is Corruption naming it.
// Written when a store is made (and when one made before markers existed is opened), through a
// temporary file renamed over it.
//
// CheckStripeFolders runs before a store opens, before anything is made or locked in the
// folders. Plain functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::swap_internal {

inline constexpr char kStripeMarkerName[] = "strata.stripe";

struct StripeMarker {
  std::string store_id;  // 32 hex digits, the same in every folder of one store
  std::string run_id;    // the run identity the store was made with (opaque; may be empty)
  uint32_t index = 0;    // the folder's place in the stripe
  uint32_t count = 0;    // folders in the store
  std::vector<std::string> folders;  // every folder's absolute path when the store was made
};

// A new store's identity: 128 random bits as 32 hex digits.
std::string NewStoreId();
// The marker of folder `index` of the store over `folders` (made absolute).
StripeMarker MakeStripeMarker(const std::string& store_id, const std::string& run_id,
                              uint32_t index, const std::vector<std::string>& folders);

std::string EncodeStripeMarker(const StripeMarker& marker);
// Corruption naming `path` when the bytes are not a sealed marker.
Result<StripeMarker> DecodeStripeMarker(std::string_view bytes, const std::string& path);

// folder's marker, read without locking; nullopt when the folder has none.
Result<std::optional<StripeMarker>> ReadStripeMarker(const std::string& folder);
// Writes `marker` into the folder open as `dir_fd` (shown as `folder`): a temporary file,
// synced and renamed over the marker, then the folder synced.
Status WriteStripeMarker(int dir_fd, const std::string& folder, const StripeMarker& marker);

// Checks the folders given for a store (`paths`, in order) against their markers, reading
// only. Resume (`create` false): every folder must hold the marker of one store at its own
// index, and every folder of that store must be given; otherwise InvalidArgument naming each
// misplaced, foreign and missing folder and the order to give them in (never "start a fresh
// run": the folders hold a store). Fresh (`create` true): a folder that holds part of another
// store is refused (InvalidArgument naming the store's run, its committed step and its
// folders), unless that store committed nothing, or nothing after `replace_through_step`;
// the folders of one whole store in their order pass (the caller decides about its own
// committed state). Folders without markers (empty ones, or a store made before markers)
// pass. `markers` receives what each folder holds.
Status CheckStripeFolders(const std::vector<std::string>& paths, bool create,
                          std::optional<uint64_t> replace_through_step,
                          std::vector<std::optional<StripeMarker>>* markers);

}  // namespace strata::swap_internal
