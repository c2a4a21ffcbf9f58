// The slot cache of the paged pool (src/pool/free_slots.hpp): the lowest free
// slot first, past those whose recorded wait still holds, and the slots known
// to wait skipped until a wake (Note [Slots known to wait]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "pool/free_slots.hpp"

namespace gpumem::test {
namespace {

using detail::block;
using detail::chunk;
using detail::free_slots;

constexpr unsigned page_shift = 12;
constexpr std::size_t page = std::size_t{1} << page_shift;

// A segment of `count` one-page slots, and a word per slot that a wait can read.
struct segment {
  explicit segment(std::size_t count) : blocks(count), words(count, 0) {
    c.base = std::uintptr_t{1} << 32;
    c.size = count * page;
    c.for_slots = true;
    for (std::size_t i = 0; i < count; ++i) {
      blocks[i].address = c.base + i * page;
      blocks[i].size = page;
      blocks[i].owner = &c;
      blocks[i].slot = true;
    }
  }
  // Slot i (free) waits until words[i] changes, as usable() records it.
  void wait(std::size_t i) { blocks[i].wait_seen = {&words[i], words[i]}; }
  block* at(std::size_t i) { return &blocks[i]; }
  std::size_t index(const block* b) const { return static_cast<std::size_t>(b - blocks.data()); }

  chunk c;
  std::vector<block> blocks;  // never resized: slots point into it
  std::vector<std::uint64_t> words;
};

block* first_ready(free_slots& slots) {
  return slots.pop_first_ready(page, [](const block*) { return true; });
}

TEST(FreeSlots, TheLowestAddressComesFirstWhateverTheOrderOfFrees) {
  segment seg(200);
  free_slots slots;
  std::set<std::size_t> model;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const std::size_t i = rng() % seg.blocks.size();
    const int what = static_cast<int>(rng() % 3);
    if (what == 0 && !model.contains(i)) {
      slots.push(seg.at(i));
      model.insert(i);
    } else if (what == 1 && model.contains(i)) {
      slots.remove(seg.at(i));
      model.erase(i);
    } else if (what == 2) {
      // The hot path's take: only when its test passes.
      const bool take = rng() % 2 == 0;
      block* b = slots.pop_first_ready(page, [&](const block* y) {
        EXPECT_EQ(seg.index(y), *model.begin());
        return take;
      });
      ASSERT_EQ(b == nullptr, model.empty() || !take);
      if (b == nullptr) continue;
      ASSERT_EQ(seg.index(b), *model.begin());
      model.erase(model.begin());
    }
    ASSERT_EQ(slots.count(), model.size());
    ASSERT_EQ(slots.count_of(page), model.size());
    ASSERT_EQ(slots.bytes(), model.size() * page);
  }
}

TEST(FreeSlots, RemovingASlotThatIsNotThereChangesNothing) {
  segment seg(4);
  free_slots slots;
  slots.push(seg.at(1));
  slots.remove(seg.at(2));
  slots.remove(seg.at(0));
  EXPECT_EQ(slots.count(), 1U);
  EXPECT_EQ(slots.peek(page), seg.at(1));
}

TEST(FreeSlots, SlotsSeenWaitingAreSkippedUntilAWake) {
  segment seg(10);
  free_slots slots;
  for (std::size_t i = 0; i < 10; ++i) slots.push(seg.at(i));
  for (std::size_t i = 0; i < 4; ++i) seg.wait(i);
  // The scan passes the four that wait and takes the fifth.
  EXPECT_EQ(first_ready(slots), seg.at(4));
  // The four are now known to wait: the hot path's peek skips them unread.
  EXPECT_EQ(slots.peek(page), seg.at(5));
  // A wait that ends without a wake is not seen (its word's writer wakes)...
  ++seg.words[1];
  EXPECT_EQ(slots.peek(page), seg.at(5));
  // ...and after the wake every slot is looked at again: slot 0 still waits.
  slots.wake();
  EXPECT_EQ(slots.peek(page), seg.at(0));
  EXPECT_EQ(first_ready(slots), seg.at(1));
  EXPECT_EQ(slots.peek(page), seg.at(2));  // 0 is known to wait again
}

TEST(FreeSlots, ASlotFreedBelowTheKnownWaitersIsSeenAtOnce) {
  segment seg(10);
  free_slots slots;
  for (std::size_t i : {0, 1, 3, 4, 6}) slots.push(seg.at(i));
  for (std::size_t i : {0, 1, 3, 4}) seg.wait(i);
  EXPECT_EQ(first_ready(slots), seg.at(6));
  EXPECT_EQ(slots.peek(page), nullptr);  // every free slot is known to wait
  // A slot freed between them: those below it are still known to wait.
  slots.push(seg.at(2));
  EXPECT_EQ(slots.peek(page), seg.at(2));
  EXPECT_EQ(first_ready(slots), seg.at(2));
  // Those above it were forgotten (the count only covers slots below the
  // newest), and a scan learns them again.
  EXPECT_EQ(slots.peek(page), seg.at(3));
  EXPECT_EQ(first_ready(slots), nullptr);
  EXPECT_EQ(slots.peek(page), nullptr);
  // One known to wait leaves (a repair takes it): the rest stay known.
  slots.remove(seg.at(1));
  slots.push(seg.at(5));
  EXPECT_EQ(slots.peek(page), seg.at(5));
  EXPECT_EQ(slots.count(), 4U);
}

TEST(FreeSlots, ASlotThatAcceptRefusesIsKnownToWaitOnlyWhenItRecordedAWait) {
  segment seg(6);
  free_slots slots;
  for (std::size_t i = 0; i < 6; ++i) slots.push(seg.at(i));
  // Slot 0 is refused with a wait recorded, slot 1 without one, slot 2 accepted.
  auto accept = [&](const block* b) {
    const std::size_t i = seg.index(b);
    if (i == 0) seg.wait(0);
    return i >= 2;
  };
  EXPECT_EQ(slots.pop_lowest_accepted(page, accept), seg.at(2));
  // Slot 0 is skipped from now on; slot 1, which may be usable, is not.
  EXPECT_EQ(slots.peek(page), seg.at(1));
  std::vector<std::size_t> offered;
  EXPECT_EQ(slots.pop_lowest_accepted(page,
                                      [&](const block* b) {
                                        offered.push_back(seg.index(b));
                                        return seg.index(b) == 4;
                                      }),
            seg.at(4));
  EXPECT_EQ(offered, (std::vector<std::size_t>{1, 3, 4}));
}

TEST(FreeSlots, SizesKeepRowsOfTheirOwn) {
  segment seg(8);
  free_slots slots;
  // Two-page slots at 0 and 4, one-page slots at 2 and 7.
  for (std::size_t i : {0, 4}) seg.blocks[i].size = 2 * page;
  for (std::size_t i : {4, 2, 7, 0}) slots.push(seg.at(i));
  EXPECT_EQ(slots.count_of(page), 2U);
  EXPECT_EQ(slots.count_of(2 * page), 2U);
  EXPECT_EQ(slots.count_of(3 * page), 0U);
  EXPECT_EQ(slots.peek(2 * page), seg.at(0));
  EXPECT_EQ(slots.peek(page), seg.at(2));
  EXPECT_EQ(slots.bytes(), 6 * page);
}

// Note [A lone free slot]: the only free slot of its size waits beside its row,
// and every question about the row answers as if it were in it.
TEST(FreeSlots, ALoneSlotIsCountedVisitedAndTakenAsItsRowsSlot) {
  segment seg(8);
  free_slots slots;
  slots.push(seg.at(5));
  EXPECT_EQ(slots.count(), 1U);
  EXPECT_EQ(slots.count_of(page), 1U);
  EXPECT_EQ(slots.bytes(), page);
  std::vector<std::size_t> seen;
  slots.for_each_until([&](const block* b) {
    seen.push_back(seg.index(b));
    return false;
  });
  EXPECT_EQ(seen, (std::vector<std::size_t>{5}));
  seen.clear();
  slots.for_each_of(page, [&](const block* b) { seen.push_back(seg.index(b)); });
  EXPECT_EQ(seen, (std::vector<std::size_t>{5}));
  // A second slot of the size, lower: both in the row, the lower first.
  slots.push(seg.at(2));
  EXPECT_EQ(slots.count_of(page), 2U);
  EXPECT_EQ(first_ready(slots), seg.at(2));
  EXPECT_EQ(first_ready(slots), seg.at(5));
  EXPECT_EQ(first_ready(slots), nullptr);
  EXPECT_EQ(slots.count(), 0U);
  // Alone again: removed, and taken only when ready.
  slots.push(seg.at(3));
  slots.remove(seg.at(3));
  EXPECT_EQ(slots.count(), 0U);
  EXPECT_EQ(first_ready(slots), nullptr);
  slots.push(seg.at(3));
  EXPECT_EQ(slots.pop_first_ready(page, [](const block*) { return false; }), nullptr);
  EXPECT_EQ(slots.count(), 1U) << "not ready: it stays";
  EXPECT_EQ(first_ready(slots), seg.at(3));
}

TEST(FreeSlots, ALoneSlotThatWaitsIsPassedAndKnownToWait) {
  segment seg(4);
  free_slots slots;
  slots.push(seg.at(1));
  seg.wait(1);
  EXPECT_EQ(first_ready(slots), nullptr);
  EXPECT_EQ(slots.count_of(page), 1U);
  // A slot freed above it is the first ready one; the waiter stays.
  slots.push(seg.at(3));
  EXPECT_EQ(first_ready(slots), seg.at(3));
  ++seg.words[1];
  slots.wake();
  EXPECT_EQ(first_ready(slots), seg.at(1));
  EXPECT_EQ(slots.count(), 0U);
}

TEST(FreeSlots, ALoneSlotKeepsItsRowWhenAnotherSizeSharesItsTableEntry) {
  // Two sizes that the row table puts in one entry: the second takes a row of
  // its own elsewhere, and the first keeps its entry while it is alone.
  auto entry_of = [](std::size_t size) { return ((size >> 8) * 0x9E3779B97F4A7C15ULL) >> (64 - 6); };
  std::size_t other = 2 * page;
  while (entry_of(other) != entry_of(page)) other += page;
  segment seg(6);
  // Slots never overlap (Note [Free slots in bitmaps]): the larger two lie above the rest.
  seg.blocks[4].address = seg.c.base + 6 * page;
  seg.blocks[5].address = seg.c.base + 6 * page + other;
  seg.blocks[4].size = other;
  seg.blocks[5].size = other;
  free_slots slots;
  slots.push(seg.at(0));  // alone in its row
  slots.push(seg.at(4));  // the other size, into the same entry's place
  EXPECT_EQ(slots.count_of(page), 1U);
  EXPECT_EQ(slots.count_of(other), 1U);
  EXPECT_EQ(slots.peek(page), seg.at(0));
  EXPECT_EQ(slots.peek(other), seg.at(4));
  slots.push(seg.at(5));
  slots.push(seg.at(1));
  EXPECT_EQ(slots.count_of(page), 2U);
  EXPECT_EQ(slots.count_of(other), 2U);
  std::multiset<std::size_t> seen;
  slots.for_each_until([&](const block* b) {
    seen.insert(seg.index(b));
    return false;
  });
  EXPECT_EQ(seen, (std::multiset<std::size_t>{0, 1, 4, 5}));
  EXPECT_EQ(slots.pop_first_ready(other, [](const block*) { return true; }), seg.at(4));
  EXPECT_EQ(first_ready(slots), seg.at(0));
  EXPECT_EQ(slots.bytes(), page + other);
}

// Note [Free slots in bitmaps]: slots whose size is no power of two, spread
// over many leaves with gaps between them, come back lowest first, are visited
// highest first, and skip the ones seen waiting, as a sorted list of them would.
TEST(FreeSlots, SlotsOfAnySizeKeepAddressOrderAcrossLeaves) {
  constexpr std::size_t size = 3 * page;  // keys: address >> 13, 1.5 keys apart
  // 400 slots, most adjacent, some with a gap of a few slots' addresses: more
  // than 64 keys, so several leaves, some of which empty and fill again.
  segment seg(400 * 5);
  std::vector<block*> all;
  std::uintptr_t at = seg.c.base;
  for (std::size_t i = 0; i < 400; ++i) {
    block& b = seg.blocks[i];
    b.address = at;
    b.size = size;
    at += size * (i % 37 == 0 ? 4 : 1);
    all.push_back(&b);
  }
  free_slots slots;
  std::set<std::uintptr_t> model;  // free slots' addresses
  std::mt19937_64 rng(3);
  auto lowest = [&](const block* y) {
    EXPECT_EQ(y->address, *model.begin());
    return true;
  };
  for (int step = 0; step < 40000; ++step) {
    block* b = all[rng() % all.size()];
    if (rng() % 2 == 0) {
      if (!model.contains(b->address)) {
        slots.push(b);
        model.insert(b->address);
      }
    } else {
      block* got = slots.pop_first_ready(size, lowest);
      ASSERT_EQ(got == nullptr, model.empty());
      if (got != nullptr) model.erase(got->address);
    }
    ASSERT_EQ(slots.count_of(size), model.size());
    if (step % 997 == 0) {
      std::vector<std::uintptr_t> seen;
      slots.for_each_of(size, [&](const block* y) { seen.push_back(y->address); });
      ASSERT_EQ(seen, std::vector<std::uintptr_t>(model.rbegin(), model.rend())) << "highest first";
    }
  }
  // The lowest half waits: a take passes them, and peek then skips them unread.
  if (model.size() >= 4) {
    std::vector<std::size_t> words(all.size(), 0);
    std::vector<std::uintptr_t> in_order(model.begin(), model.end());
    const std::size_t waiters = in_order.size() / 2;
    for (block* b : all) {
      if (model.contains(b->address) && b->address < in_order[waiters]) {
        words[static_cast<std::size_t>(b - seg.blocks.data())] = 1;
        b->wait_seen = {&words[static_cast<std::size_t>(b - seg.blocks.data())], 1};
      }
    }
    block* got = slots.pop_first_ready(size, [](const block*) { return true; });
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->address, in_order[waiters]);
    ASSERT_NE(slots.peek(size), nullptr);
    EXPECT_EQ(slots.peek(size)->address, in_order[waiters + 1 < in_order.size() ? waiters + 1 : 0]);
  }
}

// A size whose free slots lie ever higher (each new slot above the last, the
// old ones taken for good) keeps leaves for what is free, not for every
// address range it ever used (Note [Free slots in bitmaps]).
TEST(FreeSlots, ARowHoldsLeavesForItsFreeSlotsNotForEveryAddressItUsed) {
  constexpr std::size_t slots_made = 20000;
  segment seg(slots_made);
  for (std::size_t i = 0; i < slots_made; ++i) seg.blocks[i].address = seg.c.base + i * 64 * page;  // a leaf each
  free_slots slots;
  std::size_t most = 0;
  for (std::size_t i = 0; i < slots_made; ++i) {
    slots.push(seg.at(i));
    if (i >= 3) {
      ASSERT_EQ(first_ready(slots), seg.at(i - 3));  // three stay free
    }
    most = std::max(most, slots.leaves_held());
  }
  EXPECT_EQ(slots.count(), 3U);
  EXPECT_LE(most, 2 * 3 + 9U);
  for (std::size_t i = slots_made - 3; i < slots_made; ++i) EXPECT_EQ(first_ready(slots), seg.at(i));
}

// A table entry whose row emptied goes to the next size that lands there: the
// slots its old size left in the row's leaves are gone with it.
TEST(FreeSlots, AnEntryTakenByAnotherSizeForgetsTheOldSizesSlots) {
  auto entry_of = [](std::size_t size) { return ((size >> 8) * 0x9E3779B97F4A7C15ULL) >> (64 - 6); };
  std::size_t other = 2 * page;
  while (entry_of(other) != entry_of(page)) other += page;
  segment seg(200);
  free_slots slots;
  for (std::size_t i = 0; i < 100; ++i) slots.push(seg.at(i));
  for (std::size_t i = 0; i < 100; ++i) ASSERT_EQ(first_ready(slots), seg.at(i));
  // The entry is free again; slots of the other size, far above, take it.
  const std::size_t per = other / page;
  std::vector<block*> big;
  for (std::size_t i = 100; i + per <= 200; i += per) {
    seg.blocks[i].size = other;
    big.push_back(seg.at(i));
  }
  for (auto it = big.rbegin(); it != big.rend(); ++it) slots.push(*it);
  EXPECT_EQ(slots.count_of(page), 0U);
  EXPECT_EQ(slots.count_of(other), big.size());
  std::vector<const block*> seen;
  slots.for_each_until([&](const block* b) {
    seen.push_back(b);
    return false;
  });
  EXPECT_EQ(seen.size(), big.size());
  EXPECT_EQ(slots.pop_first_ready(page, [](const block*) { return true; }), nullptr);
  EXPECT_EQ(slots.pop_first_ready(other, [](const block*) { return true; }), big.front());
}

// chunk::all_ready, which every allocation of a paged pool asks, against the
// bits one by one: ranges within a word, across two, and across several.
TEST(PageBitmap, AllReadyAgreesWithTheBitsOneByOne) {
  chunk c;
  constexpr std::size_t pages = 300;
  c.ready = detail::zeroed_array<std::uint64_t>((pages + 63) / 64);
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    // Mostly ready, a few holes, so that long ranges are sometimes all ready.
    for (std::size_t i = 0; i < pages; ++i) c.set_ready(i, rng() % 50 != 0);
    for (int q = 0; q < 200; ++q) {
      const std::size_t from = rng() % pages;
      const std::size_t span = q % 3 == 0 ? rng() % 8 : rng() % (pages - from);
      const std::size_t to = std::min(pages - 1, from + span);
      bool expected = true;
      for (std::size_t i = from; i <= to; ++i) expected = expected && c.is_ready(i);
      ASSERT_EQ(c.all_ready(from, to), expected) << "pages " << from << " to " << to;
    }
  }
}

// chunk::count_ready and chunk::for_each_unready, which a slot's swaps and
// stitching use, against the bits one by one: empty ranges, ranges within a
// word, ending on a word's edge, and across several; and a stop on request.
TEST(PageBitmap, CountAndUnreadyPagesAgreeWithTheBitsOneByOne) {
  chunk c;
  constexpr std::size_t pages = 300;
  c.ready = detail::zeroed_array<std::uint64_t>((pages + 63) / 64);
  std::mt19937_64 rng(12);
  for (int round = 0; round < 200; ++round) {
    const unsigned holes = 1 + round % 4;  // from every other page to mostly ready
    for (std::size_t i = 0; i < pages; ++i) c.set_ready(i, rng() % (holes * 8) >= holes);
    for (int q = 0; q < 200; ++q) {
      const std::size_t from = q % 5 == 0 ? (rng() % 4) * 64 : rng() % pages;
      const std::size_t to = q % 7 == 0 ? std::min(pages, (from | 63) + 1) : from + rng() % (pages - from + 1);
      std::size_t ready = 0;
      std::vector<std::size_t> unready;
      for (std::size_t i = from; i < to; ++i) {
        if (c.is_ready(i)) ++ready;
        else unready.push_back(i);
      }
      ASSERT_EQ(c.count_ready(from, to), ready) << "pages " << from << " to " << to;
      std::vector<std::size_t> seen;
      ASSERT_TRUE(c.for_each_unready(from, to, [&](std::size_t i) {
        seen.push_back(i);
        return true;
      }));
      ASSERT_EQ(seen, unready) << "pages " << from << " to " << to;
      if (unready.size() >= 2) {
        seen.clear();
        ASSERT_FALSE(c.for_each_unready(from, to, [&](std::size_t i) {
          seen.push_back(i);
          return seen.size() < 2;
        }));
        ASSERT_EQ(seen, std::vector<std::size_t>(unready.begin(), unready.begin() + 2));
      }
    }
  }
}

// chunk::set_page and chunk::for_each_where, which trims and the address
// shortage use to visit the mapped pages, the aliases (mapped, not ready) and
// the ready ones a word at a time, against the pages one by one; and a stop
// on request.
TEST(PageBitmap, PagesWhereABitmapSaysAgreeWithThePagesOneByOne) {
  chunk c;
  constexpr std::size_t pages = 300;
  c.pages = detail::zeroed_array<std::uint64_t>(pages);
  c.ready = detail::zeroed_array<std::uint64_t>((pages + 63) / 64);
  c.mapped = detail::zeroed_array<std::uint64_t>((pages + 63) / 64);
  std::mt19937_64 rng(13);
  for (int round = 0; round < 100; ++round) {
    // Long stretches without a handle (a segment's tail), aliases, ready pages.
    for (std::size_t i = 0; i < pages; ++i) {
      const bool has = (i / 64 + round) % 3 != 0 && rng() % 4 != 0;
      c.set_page(i, has ? 1 + rng() % 1000 : 0);
      c.set_ready(i, has && rng() % 2 == 0);
    }
    for (int q = 0; q < 100; ++q) {
      const std::size_t from = q % 5 == 0 ? (rng() % 4) * 64 : rng() % pages;
      const std::size_t to = from + rng() % (pages - from + 1);
      std::vector<std::size_t> mapped, aliases;
      for (std::size_t i = from; i < to; ++i) {
        if (c.pages[i] != 0) mapped.push_back(i);
        if (c.pages[i] != 0 && !c.is_ready(i)) aliases.push_back(i);
      }
      std::vector<std::size_t> seen;
      ASSERT_TRUE(c.for_each_where(from, to, [&](std::size_t w) { return c.mapped[w]; }, [&](std::size_t i) {
        seen.push_back(i);
        return true;
      }));
      ASSERT_EQ(seen, mapped) << "pages " << from << " to " << to;
      seen.clear();
      ASSERT_TRUE(c.for_each_where(from, to, [&](std::size_t w) { return c.mapped[w] & ~c.ready[w]; },
                                   [&](std::size_t i) {
                                     seen.push_back(i);
                                     c.set_page(i, 0);  // as unmap_alias does: its own bit only
                                     return true;
                                   }));
      ASSERT_EQ(seen, aliases) << "pages " << from << " to " << to;
      for (std::size_t i : aliases) c.set_page(i, 7);  // back
      if (mapped.size() >= 2) {
        seen.clear();
        ASSERT_FALSE(c.for_each_where(from, to, [&](std::size_t w) { return c.mapped[w]; }, [&](std::size_t i) {
          seen.push_back(i);
          return seen.size() < 2;
        }));
        ASSERT_EQ(seen, std::vector<std::size_t>(mapped.begin(), mapped.begin() + 2));
      }
    }
  }
}

}  // namespace
}  // namespace gpumem::test
