// What the pool programs write into the memory they are handed and read back
// before they free it: stamps that say which allocation a byte belongs to. Two
// live allocations on one memory (a page mapped under both, a block handed out
// twice) or a free reused before the work ordered before it finished (a stamp
// written by the next owner before the last read of the previous one) show as a
// stamp that is not the one written. The model of program_input.hpp checks
// addresses only; this checks the bytes behind them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpumem/event.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {

// Note [Stamps in the programs' memory]
// An allocation gets an 8-byte stamp (its number and the stamp's index) at its
// first byte, at the start of every page it spans (a page: where a physical
// handle can change, so every page mapping is covered), and at its end; all
// queued on its stream, never waited for, as a program's kernels would be. A free
// on another stream first waits for that stream on the device (an event: the
// ordering the contract asks of the caller), then reads the stamps back on the
// freeing stream after a short hold (a host function that sleeps, so that the
// read is still queued when the pool is asked for memory again), then frees. The
// reads are compared at the next check, after every stream has finished. A pool
// that handed the memory to another stream without ordering it after the read
// lets that stream's stamps land first. The copies go through pinned host memory
// (a staging area, reused after each check), so that on a GPU too they are queued
// and not done at the call (a copy to pageable memory returns once done).
class program_contents {
 public:
  // `page_bytes`: the pool's page (a power of two); `streams`: every stream the
  // program runs on. Takes its pinned staging area at once, so that a program
  // that counts the device's free memory counts it after.
  program_contents(std::size_t page_bytes, std::vector<stream_view> streams);
  // Waits for the streams: queued copies still use the staging area.
  ~program_contents();
  program_contents(const program_contents&) = delete;
  program_contents& operator=(const program_contents&) = delete;

  // Stamps a new allocation of `bytes` at `p`, queued on `s`.
  void stamp(void* p, std::size_t bytes, stream_view s);
  // Before `p` is freed on `t`: orders `t` after the stamps' stream, holds `t`
  // for `hold_us` microseconds, queues the read of the stamps on `t`.
  void read_before_free(void* p, stream_view t, unsigned hold_us);
  // Reads every live allocation's stamps back, waits for the streams, compares
  // them and every read queued before a free; empty, or what is wrong.
  std::string check();

 private:
  struct stamp_at {
    std::size_t offset;
    std::size_t bytes;  // 8, or fewer at the end of an allocation under 8 bytes
  };
  struct stamped {
    std::uint64_t number;
    stream_view stream;
    std::vector<stamp_at> places;
  };
  struct queued_read {
    stamped allocation;
    const std::uint64_t* read;  // in the staging area
  };

  std::vector<stamp_at> places_of(std::uintptr_t address, std::size_t bytes) const;
  // `n` words of the staging area; when it is full, waits for the streams and
  // compares what was queued first (a failure is kept for the next check).
  std::uint64_t* staging(std::size_t n);
  std::string finish_queued();

  std::size_t page_bytes_;
  std::vector<stream_view> streams_;
  pinned_host_resource pinned_;
  std::uint64_t* staging_ = nullptr;
  std::size_t staged_ = 0;  // words of the staging area in use
  std::uint64_t next_number_ = 1;
  std::map<std::uintptr_t, stamped> live_;
  std::vector<queued_read> reads_;
  std::string failure_;  // found while the staging area was emptied
  event order_;
};

}  // namespace gpumem::test
