// How the multi-rank checks word a difference between ranks: one thing's value on every rank,
// grouped by value ("--batch: 8 on ranks 0, 2 vs 4 on rank 1"). The trainer's option check
// (messages.h) and the engine's (engine/collectives.cc) both report with it, so that the two
// read alike.
//
// Header-only and without the communicator: it is comm's module interface to the engine,
// which reaches the other ranks through strata/comm.h alone and links no comm library. Pure
// functions; safe for concurrent use.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

// "0, 2, 5": rank numbers as a message lists them.
inline std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// One thing across ranks 0..n-1: `key(r)` is what is compared (equality), `text(r)` how rank
// r's value is shown (read for the first rank of each value). Returns "" when every rank has
// the same key, otherwise "name: A on rank 0 vs B on ranks 1, 2", the values in order of the
// first rank that has each.
template <typename KeyOf, typename TextOf>
std::string DescribeRankDifference(std::string_view name, int n, KeyOf key, TextOf text) {
  using Key = decltype(key(0));
  std::vector<std::pair<Key, std::vector<int>>> groups;  // a key, the ranks that have it
  for (int r = 0; r < n; ++r) {
    const Key k = key(r);
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == k; });
    if (g == groups.end()) {
      groups.push_back({k, {r}});
    } else {
      g->second.push_back(r);
    }
  }
  if (groups.size() < 2) return "";
  std::string out = std::string(name) + ":";
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::vector<int>& ranks = groups[i].second;
    out += std::string(i == 0 ? " " : " vs ") + text(ranks[0]) + " on rank" +
           (ranks.size() > 1 ? "s " : " ") + RankList(ranks);
  }
  return out;
}

}  // namespace strata
