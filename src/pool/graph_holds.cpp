// graph_holds (graph_holds.hpp).
#include "pool/graph_holds.hpp"

namespace gpumem::detail {

// Note [A pool block freed under a capture]
// A program may free, under a capture, a block the pool handed out before it:
// PyTorch does when a tensor made before torch.cuda.graph dies inside it, and
// its own allocator takes the block back then. The graph being captured may use
// the block (a kernel captured before the free), and runs later, any number of
// times: the pool must not hand the block out again while any launch of that
// graph can still come. So the free makes the block held: out of the live map (a
// second free is refused as a double free), its bytes still counted in use, its
// pages busy, and the driver is asked to tell when the graph is gone. A user
// object does that: made with the block as its pointer, its one reference moved
// to the graph being captured (cuStreamGetCaptureInfo names it; cuGraphRetainUserObject
// is permitted on it during the capture). The driver drops the graph's
// reference when the graph and every executable graph made from it (and every
// clone) are destroyed and their launches are done, and then calls the destroy
// function on a thread of its own; for a capture that ends invalidated, at its
// end. Measured on an H200, driver 580.159.04, in each capture mode and from the
// capturing thread and another (docs/pool.md, "CUDA graphs"). The destroy function may make no driver call: it only queues the
// block for the pool, which takes it back at its next slow path (an allocation
// that misses its caches, trim, statistics), as a free on the block's own
// stream at that moment. That is stream-ordered: the block's last uses outside
// the graph were queued on that stream before the capture began, so its later
// work follows them, and other streams take the block only through that
// stream's fences recorded after it. Only a free on the stream the block was
// handed out on is held: a free on another would need a fence recorded on the
// freeing stream, which is under capture (a logic_error, as before). A capture
// already invalidated will run nothing: the block is freed at once.
// The queue outlives the pool (shared with each pending destroy function), so a
// graph destroyed after its pool writes into memory of its own. A pool destroyed
// while a graph still holds one of its blocks says so: that graph must not run again.

namespace {

struct hold_record {
  std::shared_ptr<graph_holds::shared_state> shared;
  graph_holds::held h;
};

void CUDA_CB graph_released(void* p) {
  // On the driver's thread: no driver call, nothing that throws out.
  auto* record = static_cast<hold_record*>(p);
  if (record->h.freed == nullptr) {  // never held: hold() failed
    delete record;
    return;
  }
  try {
    std::lock_guard lock(record->shared->mutex);
    record->shared->released.push_back(record->h);
    record->shared->released_count.fetch_add(1, std::memory_order_release);
  } catch (...) {
    // No host memory for the queue: the block stays held (counted, never reused).
  }
  delete record;
}

}  // namespace

graph_holds::graph_holds() : shared_(std::make_shared<shared_state>()) {}

graph_holds::~graph_holds() = default;

void graph_holds::hold(CUgraph graph, held h) {
  auto record = std::make_unique<hold_record>(hold_record{shared_, h});
  CUuserObject object = nullptr;
  GPUMEM_CU(cuUserObjectCreate, &object, record.get(), &graph_released, 1U, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  holding_.fetch_add(1, std::memory_order_relaxed);
  holding_bytes_.fetch_add(h.bytes, std::memory_order_relaxed);
  const CUresult r = driver().cuGraphRetainUserObject(graph, object, 1U, CU_GRAPH_USER_OBJECT_MOVE);
  if (r != CUDA_SUCCESS) {
    // Still ours alone: its destroy function (now or later, on the driver's
    // thread) finds nothing held, and the caller keeps the block as it was.
    returned(h);
    record->h.freed = nullptr;
    (void)record.release();
    (void)driver().cuUserObjectRelease(object, 1U);
    check(r, "cuGraphRetainUserObject", __FILE__, __LINE__);
  }
  (void)record.release();  // the destroy function's now
}

std::vector<graph_holds::held> graph_holds::take_released() {
  std::vector<held> out;
  {
    std::lock_guard lock(shared_->mutex);
    out.swap(shared_->released);
    shared_->released_count.fetch_sub(out.size(), std::memory_order_relaxed);
  }
  return out;
}

}  // namespace gpumem::detail
