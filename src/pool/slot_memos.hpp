// Paged pools: the ways a free slot's pages were last taken back, remembered so
// that the next take-back the same way is checked and swapped a run of pages at
// a time (Note [Take-backs remembered], src/vmm/page_slots.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace gpumem::detail {

// Pages [at, at + n) of a slot whose handles' primary places were pages from,
// from + step, ..., of the same segment, all under one slot there.
struct memo_run {
  std::uint32_t at = 0;
  std::uint32_t from = 0;
  std::uint32_t n = 0;
  std::int32_t step = 1;  // +1 or -1
  // The source pages, lowest and one past the highest.
  std::size_t source_begin() const noexcept { return step > 0 ? from : std::size_t{from} + 1 - n; }
  std::size_t source_end() const noexcept { return step > 0 ? std::size_t{from} + n : std::size_t{from} + 1; }
  bool operator==(const memo_run&) const = default;
};

// One take-back: the runs, in the order of the slot's pages.
struct slot_memo {
  static constexpr std::size_t max_runs = 6;
  std::array<memo_run, max_runs> runs{};
  std::uint32_t count = 0;
  std::uint32_t pages = 0;  // the pages taken back (the sum of the runs' n)

  // Adds page `at`, taken back from page `from`; `same_source_slot`: `from` is
  // under the slot of the last run's source. False when the memo cannot hold it
  // (too many runs, or an index past 32 bits): the take-back is not remembered.
  bool extend(std::size_t at, std::size_t from, bool same_source_slot) noexcept {
    constexpr std::size_t most = std::numeric_limits<std::uint32_t>::max() / 2;
    if (at > most || from > most) return false;
    const auto at32 = static_cast<std::uint32_t>(at), from32 = static_cast<std::uint32_t>(from);
    if (count != 0 && same_source_slot) {
      memo_run& r = runs[count - 1];
      if (r.at + r.n == at32) {
        if (r.n == 1 && std::int64_t{from32} + 1 == std::int64_t{r.from}) r.step = -1;  // a run taken downwards
        if (std::int64_t{r.from} + std::int64_t{r.step} * r.n == std::int64_t{from32}) {
          ++r.n;
          ++pages;
          return true;
        }
      }
    }
    if (count == max_runs) return false;
    runs[count++] = {at32, from32, 1, 1};
    ++pages;
    return true;
  }
  bool operator==(const slot_memo& o) const noexcept {
    if (count != o.count || pages != o.pages) return false;
    for (std::uint32_t k = 0; k < count; ++k) {
      if (!(runs[k] == o.runs[k])) return false;
    }
    return true;
  }
};

// A slot's last `ways` different take-backs, the oldest replaced first.
struct slot_memo_set {
  static constexpr std::size_t ways = 8;
  std::array<std::uint32_t, ways> keys{};  // each memo's pages (0: none): the first test of a match
  std::array<slot_memo, ways> memos{};
  std::size_t first_page = 0;  // the slot's first page: a set serves the slot it was made for
  std::uint32_t next = 0;

  void remember(const slot_memo& m) noexcept {
    for (std::size_t w = 0; w < ways; ++w) {
      if (keys[w] == m.pages && memos[w] == m) return;
    }
    keys[next] = m.pages;
    memos[next] = m;
    next = (next + 1) % ways;
  }
};

}  // namespace gpumem::detail
