// W9 peer: how fast another device reaches a block of this device's memory, for
// each way of letting it. The default resource maps its pages for every device
// that can reach them (vmm_pool_options::access_for_every_peer); the
// vmm_pool_resource row names the peer (vmm_pool_options::peer_devices, access
// for the pool's owner alone otherwise): one cuMemSetAccess per new mapping, only
// that pool's memory becomes reachable. async_resource grants its driver pool's
// memory with set_access (cuMemPoolSetAccess); cuMemAlloc's memory is reached
// after cuCtxEnablePeerAccess, which maps every allocation of the context (what a
// program calls before cudaMemcpyPeer to copy over the link; gpumem never calls it).
//
// Columns, in GB/s (bytes moved / event time on the stream that moved them):
// kernels on the peer device reading and writing the block; copies of the block
// into a cuMemAlloc buffer of the peer device, on a peer stream (in the cuMemAlloc
// row, cudaMemcpyPeer: the reference for the link); and the owner's own kernels
// reading it (the local bandwidth, for scale). The kernels are PTX embedded below
// (kernels.hpp says why). The table has those four rows; every cell is skipped on
// the simulator (no kernels, no link) or with one device.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "harness.hpp"
#include "kernels.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t full_bytes = std::size_t{256} << 20;
constexpr std::size_t quick_bytes = std::size_t{64} << 20;
constexpr int passes = 8;               // kernels or copies per timed repetition
constexpr unsigned threads_per_block = 256;
constexpr unsigned blocks_per_sm = 8;   // 2,048 threads an SM: enough loads in flight to cover the link
constexpr const char* read_kernel = "gpumem_bench_peer_read";
constexpr const char* write_kernel = "gpumem_bench_peer_write";

// Grid-stride loops over 16-byte words. The reader folds what it loads into one
// value and stores it only if it equals a constant, so the loads cannot be dropped.
// PTX ISA 8.0, sm_75; ctest gpumem_bench_w9_ptx checks it with ptxas.
constexpr const char peer_ptx[] = R"ptx(
.version 8.0
.target sm_75
.address_size 64

.visible .entry gpumem_bench_peer_read(
	.param .u64 gpumem_bench_peer_read_param_0,
	.param .u64 gpumem_bench_peer_read_param_1,
	.param .u64 gpumem_bench_peer_read_param_2
)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<21>;
	.reg .b64 	%rd<17>;

	ld.param.u64 	%rd8, [gpumem_bench_peer_read_param_0];
	ld.param.u64 	%rd9, [gpumem_bench_peer_read_param_1];
	ld.param.u64 	%rd10, [gpumem_bench_peer_read_param_2];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	cvt.u64.u32 	%rd1, %r4;
	mul.wide.u32 	%rd11, %r3, %r4;
	mov.u32 	%r5, %tid.x;
	cvt.u64.u32 	%rd12, %r5;
	add.s64 	%rd16, %rd11, %rd12;
	setp.ge.u64 	%p1, %rd16, %rd9;
	@%p1 bra 	$L__BB0_5;
	mov.u32 	%r7, %nctaid.x;
	cvt.u64.u32 	%rd13, %r7;
	mul.lo.s64 	%rd3, %rd13, %rd1;
	cvta.to.global.u64 	%rd4, %rd10;
	cvta.to.global.u64 	%rd5, %rd8;
	mov.u32 	%r20, 0;
$L__BB0_2:
	shl.b64 	%rd14, %rd16, 4;
	add.s64 	%rd15, %rd5, %rd14;
	ld.global.v4.u32 	{%r8, %r9, %r10, %r11}, [%rd15];
	xor.b32  	%r16, %r9, %r20;
	xor.b32  	%r17, %r16, %r8;
	xor.b32  	%r18, %r17, %r10;
	xor.b32  	%r20, %r18, %r11;
	add.s64 	%rd16, %rd16, %rd3;
	setp.lt.u64 	%p2, %rd16, %rd9;
	@%p2 bra 	$L__BB0_2;
	setp.ne.s32 	%p3, %r20, -1640531527;
	@%p3 bra 	$L__BB0_5;
	mov.u32 	%r19, -1640531527;
	st.global.u32 	[%rd4], %r19;
$L__BB0_5:
	ret;
}

.visible .entry gpumem_bench_peer_write(
	.param .u64 gpumem_bench_peer_write_param_0,
	.param .u64 gpumem_bench_peer_write_param_1,
	.param .u32 gpumem_bench_peer_write_param_2
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<15>;

	ld.param.u64 	%rd7, [gpumem_bench_peer_write_param_0];
	ld.param.u64 	%rd8, [gpumem_bench_peer_write_param_1];
	ld.param.u32 	%r1, [gpumem_bench_peer_write_param_2];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	cvt.u64.u32 	%rd1, %r3;
	mul.wide.u32 	%rd9, %r2, %r3;
	mov.u32 	%r4, %tid.x;
	cvt.u64.u32 	%rd10, %r4;
	add.s64 	%rd14, %rd9, %rd10;
	setp.ge.u64 	%p1, %rd14, %rd8;
	@%p1 bra 	$L__BB1_3;
	mov.u32 	%r5, %nctaid.x;
	cvt.u64.u32 	%rd11, %r5;
	mul.lo.s64 	%rd3, %rd11, %rd1;
	cvta.to.global.u64 	%rd4, %rd7;
$L__BB1_2:
	shl.b64 	%rd12, %rd14, 4;
	add.s64 	%rd13, %rd4, %rd12;
	st.global.v4.u32 	[%rd13], {%r1, %r1, %r1, %r1};
	add.s64 	%rd14, %rd14, %rd3;
	setp.lt.u64 	%p2, %rd14, %rd8;
	@%p2 bra 	$L__BB1_2;
$L__BB1_3:
	ret;
}
)ptx";

// Frees from a destructor, which must not throw: a cell that is already failing
// (a peer fault makes every later call fail) reports its first error, not this one.
void free_quietly(memory_resource& mr, void* p, std::size_t bytes, stream_view s) noexcept {
  try {
    mr.deallocate(p, bytes, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-bench: W9: freeing %zu bytes failed: %s\n", bytes, e.what());
  }
}

// How a row lets the peer device reach its memory.
enum class peer_path { every_peer, vmm_peer_devices, pool_access, context_peer_access, none };

peer_path path_of(const subject& s) {
  if (s.name == default_subject_name) return peer_path::every_peer;
  if (s.name == vmm_pool_subject_name) return peer_path::vmm_peer_devices;
  if (s.name == async_subject_name) return peer_path::pool_access;
  if (s.name == cumemalloc_subject_name) return peer_path::context_peer_access;
  return peer_path::none;
}

// The two kernels on one device, launched over a whole block.
class touch_kernels {
 public:
  explicit touch_kernels(int device)
      : module_(device, peer_ptx), read_(module_.function(read_kernel)), write_(module_.function(write_kernel)) {
    int sms = 0;
    GPUMEM_CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    blocks_ = static_cast<unsigned>(std::max(sms, 1)) * blocks_per_sm;
    sink_ = static_cast<unsigned*>(sink_memory_.allocate(sizeof(unsigned), stream_view{}));
  }
  ~touch_kernels() { free_quietly(sink_memory_, sink_, sizeof(unsigned), stream_view{}); }
  touch_kernels(const touch_kernels&) = delete;
  touch_kernels& operator=(const touch_kernels&) = delete;

  void read(const void* p, std::size_t bytes, CUstream s) const {
    const void* ptr = p;
    unsigned long long words = bytes / 16;
    unsigned* sink = sink_;
    void* args[] = {&ptr, &words, &sink};
    launch(read_, args, s);
  }
  void write(void* p, std::size_t bytes, unsigned value, CUstream s) const {
    unsigned long long words = bytes / 16;
    void* args[] = {&p, &words, &value};
    launch(write_, args, s);
  }

 private:
  void launch(CUfunction f, void** args, CUstream s) const {
    detail::device_context_guard guard(module_.device());
    GPUMEM_CU(cuLaunchKernel, f, blocks_, 1, 1, threads_per_block, 1, 1, 0, s, args, nullptr);
  }

  ptx_module module_;
  CUfunction read_, write_;
  unsigned blocks_ = 0;
  cuda_resource sink_memory_{module_.device()};
  unsigned* sink_ = nullptr;
};

// cuCtxEnablePeerAccess from `peer`'s context to `owner`'s for the scope (left as
// it was found when it was already enabled).
class context_peer_access {
 public:
  context_peer_access(int owner, int peer) : owner_(owner), peer_(peer) {
    detail::device_context_guard guard(peer);
    const CUresult r = detail::driver().cuCtxEnablePeerAccess(detail::primary_context(owner), 0);
    if (r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) detail::check(r, "cuCtxEnablePeerAccess", __FILE__, __LINE__);
    enabled_here_ = r == CUDA_SUCCESS;
  }
  ~context_peer_access() {
    if (!enabled_here_) return;
    detail::device_context_guard guard(peer_);
    (void)detail::driver().cuCtxDisablePeerAccess(detail::primary_context(owner_));  // nothing to do if it fails
  }
  context_peer_access(const context_peer_access&) = delete;
  context_peer_access& operator=(const context_peer_access&) = delete;

 private:
  int owner_, peer_;
  bool enabled_here_ = false;
};

// A block from `mr` (on `owner`), freed on `st` when it goes.
struct block {
  block(memory_resource& r, std::size_t n, stream& s) : mr(r), bytes(n), st(s), ptr(r.allocate(n, s)) {}
  ~block() { free_quietly(mr, ptr, bytes, st); }
  memory_resource& mr;
  std::size_t bytes;
  stream& st;
  void* ptr;
  block(const block&) = delete;
  block& operator=(const block&) = delete;
};

class peer_workload final : public workload {
 public:
  std::string_view id() const override { return "W9"; }
  std::string_view name() const override { return "peer"; }
  std::string_view figure() const override {
    return "GB/s at which another device reads, writes and copies a block of this device's memory that the row "
           "lets it reach; the owner's own reads for scale";
  }

  std::vector<column> columns(const options&) const override {
    return {{"peer reads", "GB/s", false},
            {"peer writes", "GB/s", false},
            {"copy to peer", "GB/s", false},
            {"owner reads", "GB/s", false}};
  }

  std::string method(const options& opts) const override {
    return "median of " + std::to_string(opts.reps) + " repetition" + (opts.reps == 1 ? "" : "s") +
           " after a warm-up; a repetition is " + std::to_string(passes) +
           " kernels or copies over the block, timed with CUDA events on the stream that ran them";
  }

  bool has_row_for(const subject& s) const override { return path_of(s) != peer_path::none; }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    const peer_path path = path_of(s);
    if (path == peer_path::none) return std::vector<cell>(4, skipped_cell("no way to grant another device access"));
    if (current_backend() == backend_kind::sim) {
      return std::vector<cell>(4, skipped_cell("needs a GPU (kernels): the simulator runs none"));
    }
    if (device_count() < 2) return std::vector<cell>(4, skipped_cell("needs two devices"));
    const int owner = ctx.device;
    const int peer = (owner + 1) % device_count();
    int can = 0;
    GPUMEM_CU(cuDeviceCanAccessPeer, &can, peer, owner);
    if (can == 0) {
      return std::vector<cell>(4, skipped_cell("device " + std::to_string(peer) + " cannot access device " +
                                               std::to_string(owner) + "'s memory"));
    }
    const std::size_t bytes = ctx.opts.quick ? quick_bytes : full_bytes;
    last_bytes_ = bytes;
    last_owner_ = owner;
    last_peer_ = peer;
    return run_cells(s, ctx, 4, [&](memory_resource& row_mr, stream& st) -> std::vector<cell> {
      std::unique_ptr<vmm_pool_resource> mapped_for_peer;
      memory_resource* mr = &row_mr;
      if (path == peer_path::vmm_peer_devices) {
        vmm_pool_options o;
        o.access_for_every_peer = false;
        o.peer_devices = {peer};
        mapped_for_peer = std::make_unique<vmm_pool_resource>(owner, o);
        mr = mapped_for_peer.get();
      } else if (path == peer_path::pool_access) {
        dynamic_cast<async_resource&>(row_mr).set_access(peer, pool_access::read_write);  // the default already does
      }
      std::optional<context_peer_access> whole_context;
      if (path == peer_path::context_peer_access) whole_context.emplace(owner, peer);
      stream peer_stream(peer, stream::flags::non_blocking);
      cuda_resource peer_memory(peer);
      const touch_kernels on_owner(owner), on_peer(peer);
      const block b{*mr, bytes, st};
      const block target{peer_memory, bytes, peer_stream};
      on_owner.write(b.ptr, bytes, 0x5a5a5a5a, st.handle());
      st.synchronize();

      auto rate = [&](int device, stream& on, auto&& one_pass) {
        one_pass();  // warm-up: first touch of the mapping from this device
        cell c;
        c.iterations = passes;
        for (int r = 0; r < ctx.opts.reps; ++r) {
          const double ms = elapsed_ms(device, on.handle(), [&] {
            for (int i = 0; i < passes; ++i) one_pass();
          });
          c.reps.push_back(ms > 0 ? static_cast<double>(bytes) * passes / (ms * 1e6) : 0);
        }
        on.synchronize();
        return c;
      };
      cell reads = rate(peer, peer_stream, [&] { on_peer.read(b.ptr, bytes, peer_stream.handle()); });
      cell writes = rate(peer, peer_stream, [&] { on_peer.write(b.ptr, bytes, 0x3c3c3c3c, peer_stream.handle()); });
      cell copies = rate(peer, peer_stream, [&] {
        GPUMEM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(target.ptr), reinterpret_cast<CUdeviceptr>(b.ptr),
                  bytes, peer_stream.handle());
      });
      cell local = rate(owner, st, [&] { on_owner.read(b.ptr, bytes, st.handle()); });
      return {reads, writes, copies, local};
    });
  }

  std::vector<std::string> notes(const workload_result&) const override {
    if (last_bytes_ == 0) return {};
    return {"a " + size_label(last_bytes_) + " block of device " + std::to_string(last_owner_) +
                ", reached from device " + std::to_string(last_peer_) +
                "; kernels of " + std::to_string(blocks_per_sm) + " blocks of " + std::to_string(threads_per_block) +
                " threads an SM, 16-byte loads and stores",
            "copy to peer: cuMemcpyAsync from the block to a cuMemAlloc buffer of the peer on a peer stream; the "
            "cuMemAlloc row enables peer access for the whole context (cuCtxEnablePeerAccess) and its copy is "
            "cudaMemcpyPeer's, the reference for the link"};
  }

 private:
  mutable std::size_t last_bytes_ = 0;  // for the notes
  mutable int last_owner_ = 0;
  mutable int last_peer_ = 1;
};

}  // namespace

const workload& w9_peer() {
  static const peer_workload w;
  return w;
}

}  // namespace gpumem::bench
