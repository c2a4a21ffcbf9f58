// GPUMEM_CONF: the grammar, its errors, what it builds, and the default current
// resource following it.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "adaptors/adaptor_test_support.hpp"
#include "driver/driver.hpp"
#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/config.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/capture.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string error_of(std::string_view conf) {
  try {
    describe_config(conf);
  } catch (const logic_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Config, AdaptorsAreLayeredInOneOrderWhateverTheOrderWritten) {
  EXPECT_EQ(describe_config("cuda"), "cuda");
  EXPECT_EQ(describe_config("pool"), "pool(cuda)");
  EXPECT_EQ(describe_config(" Pool , initial = 50% "), "pool(cuda)");
  EXPECT_EQ(describe_config("pool,stats,limit=1G,defer,track"), "stats(track(defer(limit(pool(cuda)))))");
  EXPECT_EQ(describe_config("pool,log=/tmp/x.csv,stats"), "log(stats(pool(log:upstream(cuda))))");
  EXPECT_EQ(describe_config("cuda,track=stacks,log=x.csv,sites"), "log(track(cuda))");
  EXPECT_EQ(describe_config("async"), "async");
  EXPECT_EQ(describe_config("MANAGED"), "managed");
  EXPECT_EQ(describe_config("vmm"), "vmm");
  EXPECT_EQ(describe_config("async,initial=1M,maximum=50%,release_threshold=2M,stats"), "stats(async)");
  EXPECT_EQ(describe_config("vmm,log=x.csv,limit=1G,defer,track,stats,sites,release_threshold=1G"),
            "log(stats(track(defer(limit(vmm)))))")
      << "no upstream log: the pool's memory does not pass through a resource below it";
  EXPECT_EQ(describe_config("managed,log=x.csv,track=stacks"), "log(track(managed))");
}

TEST(Config, ErrorsNameTheBadToken) {
  EXPECT_NE(error_of("pool,initail=50%").find("unknown option \"initail=50%\""), std::string::npos);
  EXPECT_NE(error_of("pool,initial=lots").find("\"lots\" is not a size"), std::string::npos);
  EXPECT_NE(error_of("pool,initial=0").find("is not a size"), std::string::npos);
  EXPECT_NE(error_of("pool,maximum=150%").find("is not a size"), std::string::npos);
  EXPECT_NE(error_of("pool,initial").find("option \"initial\" needs a size"), std::string::npos);
  EXPECT_NE(error_of("cuda,initial=1G").find("option \"initial=1G\" applies to pool or async, not to base \"cuda\""),
            std::string::npos);
  EXPECT_NE(error_of("pool,stats,stats").find("\"stats\" is given twice"), std::string::npos);
  EXPECT_NE(error_of("pool,stats=1").find("takes no value"), std::string::npos);
  EXPECT_NE(error_of("pool,,stats").find("empty option"), std::string::npos);
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("heap").find("unknown base resource \"heap\" (known: cuda, pool, async, managed, vmm, default)"),
            std::string::npos);
  EXPECT_NE(error_of("initial=1G").find("first token must name a base resource"), std::string::npos);
  EXPECT_NE(error_of("pool,log=").find("needs a path"), std::string::npos);
  EXPECT_NE(error_of("pool,sites").find("needs log=PATH"), std::string::npos);
  EXPECT_NE(error_of("pool,track=all").find("track takes no value or \"stacks\""), std::string::npos);
  EXPECT_NE(error_of("pool,x=1").find("GPUMEM_CONF \"pool,x=1\""), std::string::npos) << "the whole string is quoted";
  EXPECT_THROW(make_resource_from_config("pool,bogus", 0), logic_error);
  // A size that parses but no pool can take says which field, not "0 bytes requested".
  try {
    (void)make_resource_from_config("pool,initial=18446744073709551615", 0);
    ADD_FAILURE() << "initial=2^64-1 accepted";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("initial_bytes 18446744073709551615 is larger"), std::string::npos)
        << e.what();
  }
}

// peers=all (the default) / peers=none: whether the other devices get access to the pool's memory.
TEST(Config, PeersSaysWhichOtherDevicesMayUseThePool) {
  EXPECT_NE(error_of("pool,peers=none").find("applies to async or vmm"), std::string::npos);
  EXPECT_NE(error_of("vmm,peers=1").find("peers takes \"all\" or \"none\""), std::string::npos);
  EXPECT_NE(error_of("vmm,peers").find("peers takes \"all\" or \"none\""), std::string::npos);
  if (device_count() < 2 || peers_of(0).empty()) GTEST_SKIP() << "needs two devices with peer access";
  auto access_of_device_1 = [](std::string_view conf) {
    auto mr = make_resource_from_config(conf, 0);
    stream s(0);
    void* p = mr->allocate(3 << 20, s);
    unsigned long long flags = 0;
    CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 1};
    {
      detail::device_context_guard g(0);
      GPUMEM_CU(cuMemGetAccess, &flags, &loc, reinterpret_cast<CUdeviceptr>(p));
    }
    mr->deallocate(p, 3 << 20, s);
    return flags;
  };
  EXPECT_EQ(access_of_device_1("default"), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(access_of_device_1("vmm,peers=all"), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(access_of_device_1("default,peers=none"), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  EXPECT_NO_THROW((void)make_resource_from_config("async,peers=none", 0));
  EXPECT_NO_THROW((void)make_resource_from_config("async,peers=all", 0));
}

// One parser for sizes with GPUMEM_SIM_MEMORY: "16GB" is 16 GiB in both.
TEST(Config, SizesTakeTheSameUnitsAsTheSimulatorsMemory) {
  for (const char* conf : {"pool,maximum=512MB", "pool,maximum=512M", "pool,maximum=512MiB", "pool,maximum=512 mib"}) {
    EXPECT_NE(describe_config(conf).find("pool"), std::string::npos) << conf;
  }
  EXPECT_NE(error_of("pool,maximum=512XB").find("is not a size"), std::string::npos);
}

TEST(Config, TheDefaultBaseIsThePagedPoolWithABudget) {
  // GPUMEM_CONF=default,maximum=...: the stack a program gets unset, with a hard cap.
  auto r = make_resource_from_config("default,maximum=25%", 0);
  auto* vmm = dynamic_cast<vmm_pool_resource*>(r.get());
  ASSERT_NE(vmm, nullptr);
  EXPECT_EQ(vmm->options().maximum_bytes, device_memory_info(0).total_bytes / 4);
  auto m = make_resource_from_config("vmm,maximum=1G", 0);
  EXPECT_EQ(dynamic_cast<vmm_pool_resource*>(m.get())->options().maximum_bytes, std::size_t{1} << 30);
}

// watch_captures: the pools hold the capture watch (docs/pool.md, "The capture watch")
// and still give a stream under capture the graph's memory.
TEST(Config, WatchCapturesTurnsOnThePoolsCaptureWatch) {
  EXPECT_NE(error_of("async,watch_captures").find("applies to pool or vmm, not to base \"async\""), std::string::npos);
  EXPECT_NE(error_of("cuda,watch_captures").find("applies to pool or vmm"), std::string::npos);
  EXPECT_NE(error_of("default,watch_captures=yes").find("takes no value"), std::string::npos);
  EXPECT_EQ(describe_config("default,watch_captures,stats"), "stats(default)");

  auto unwatched = make_resource_from_config("default", 0);
  EXPECT_FALSE(dynamic_cast<vmm_pool_resource&>(*unwatched).options().watch_captures);
  auto r = make_resource_from_config("default,watch_captures", 0);
  auto& vmm = dynamic_cast<vmm_pool_resource&>(*r);
  EXPECT_TRUE(vmm.options().watch_captures);
  stream s(0);
  expect_graph_memory_under_capture(vmm, s, 3 * MiB);

  auto p = make_resource_from_config("pool,watch_captures", 0);
  auto& pool = dynamic_cast<pool_resource&>(*p);
  EXPECT_TRUE(pool.options().watch_captures);
  expect_graph_memory_under_capture(pool, s, 1000);
}

TEST(Config, OptionsABaseDoesNotTakeAreRefused) {
  const struct {
    const char* conf;
    const char* message;
  } refused[] = {
      {"cuda,maximum=1G", "option \"maximum=1G\" applies to pool, async or vmm, not to base \"cuda\""},
      {"vmm,initial=64M", "option \"initial=64M\" applies to pool or async, not to base \"vmm\""},
      {"vmm,min_chunk=2M", "option \"min_chunk=2M\" applies to pool, not to base \"vmm\""},
      {"async,max_chunk=1G", "option \"max_chunk=1G\" applies to pool, not to base \"async\""},
      {"managed,initial=1G", "option \"initial=1G\" applies to pool or async, not to base \"managed\""},
      {"managed,release_threshold=1G",
       "option \"release_threshold=1G\" applies to async or vmm, not to base \"managed\""},
      {"pool,release_threshold=1G", "option \"release_threshold=1G\" applies to async or vmm, not to base \"pool\""},
      {"cuda,release_threshold=1G", "applies to async or vmm, not to base \"cuda\""},
  };
  for (const auto& r : refused) {
    const std::string e = error_of(r.conf);
    EXPECT_NE(e.find(r.message), std::string::npos) << r.conf << ": " << e;
    EXPECT_NE(e.find(std::string("GPUMEM_CONF \"") + r.conf + "\""), std::string::npos) << e;
    EXPECT_THROW(make_resource_from_config(r.conf, 0), logic_error) << r.conf;
  }
  // The adaptors apply to every base.
  for (const char* base : {"cuda", "pool", "async", "managed", "vmm"}) {
    EXPECT_NO_THROW(describe_config(std::string(base) + ",limit=1G,defer,track=stacks,stats,log=x.csv,sites")) << base;
  }
  EXPECT_NE(error_of("vmm,release_threshold").find("option \"release_threshold\" needs a size"), std::string::npos);
  EXPECT_NE(error_of("async,release_threshold=0").find("is not a size"), std::string::npos);
}

// What every base built from a configuration on device 0 says of itself.
void expect_thread_safe_device_memory(const resource_properties& props, bool host_accessible) {
  EXPECT_EQ(props.device, 0);
  EXPECT_TRUE(props.device_accessible);
  EXPECT_EQ(props.host_accessible, host_accessible);
  EXPECT_TRUE(props.thread_safe);
}

TEST(Config, AsyncBuildsTheDriversStreamOrderedPool) {
  auto r = make_resource_from_config("async,initial=4M,maximum=64MiB,release_threshold=64M", 0);
  // (A threshold below the driver's reservation chunk would let it give the primed memory back.)
  auto* async = dynamic_cast<async_resource*>(r.get());
  ASSERT_NE(async, nullptr) << describe_config("async");
  EXPECT_TRUE(async->owns_pool()) << "a pool of its own, so that the options apply to it alone";
  EXPECT_EQ(async->device(), 0);
  EXPECT_EQ(async->release_threshold(), 64 * MiB);
  EXPECT_GE(async->statistics().reserved_bytes, 4 * MiB) << "initial is reserved at construction";
  expect_thread_safe_device_memory(r->properties(), /*host_accessible=*/false);
  stream s(0);
  void* p = r->allocate(MiB, s);
  device_fill(p, MiB, 0xA5, s);
  EXPECT_EQ(device_count_mismatches(p, MiB, 0xA5, s), 0U);
  EXPECT_EQ(async->allocated_bytes(), MiB);
  EXPECT_THROW(r->allocate(65 * MiB, s), out_of_memory) << "maximum bounds the pool";
  r->deallocate(p, MiB, s);
  s.synchronize();
  EXPECT_EQ(async->allocation_count(), 0U);

  auto whole = make_resource_from_config("async,release_threshold=1%", 0);
  EXPECT_EQ(dynamic_cast<async_resource*>(whole.get())->release_threshold(), device_memory_info(0).total_bytes / 100);
  auto keep_all = make_resource_from_config("async", 0);
  EXPECT_EQ(dynamic_cast<async_resource*>(keep_all.get())->release_threshold(), std::numeric_limits<std::size_t>::max())
      << "without release_threshold the pool keeps what it has, as pool does";

  try {
    make_resource_from_config("async,initial=16M,release_threshold=8M", 0);
    ADD_FAILURE() << "initial above release_threshold was accepted";
  } catch (const logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("GPUMEM_CONF \"async,initial=16M,release_threshold=8M\""), std::string::npos) << what;
    EXPECT_NE(what.find("above release_threshold_bytes"), std::string::npos) << what;
  }
  EXPECT_THROW(make_resource_from_config("async,initial=2M,maximum=1M", 0), logic_error);
}

TEST(Config, ManagedBuildsManagedMemoryTheHostCanTouch) {
  auto r = make_resource_from_config("managed", 0);
  auto* managed = dynamic_cast<managed_resource*>(r.get());
  ASSERT_NE(managed, nullptr);
  EXPECT_EQ(managed->device(), 0);
  EXPECT_EQ(managed->attach(), managed_attach::global);
  expect_thread_safe_device_memory(r->properties(), /*host_accessible=*/true);
  stream s(0);
  auto* p = static_cast<unsigned char*>(r->allocate(MiB, s));
  EXPECT_EQ(managed->allocated_bytes(), MiB);
  s.synchronize();
  std::memset(p, 0x3C, MiB);
  EXPECT_EQ(device_count_mismatches(p, MiB, 0x3C, s), 0U) << "the device reads what the host wrote";
  r->deallocate(p, MiB, s);
  EXPECT_EQ(managed->allocation_count(), 0U);
}

TEST(Config, VmmBuildsTheVirtualMemoryPool) {
  auto r = make_resource_from_config("vmm,release_threshold=2MiB", 0);
  auto* vmm = dynamic_cast<vmm_pool_resource*>(r.get());
  ASSERT_NE(vmm, nullptr);
  EXPECT_EQ(vmm->options().release_threshold_bytes, 2 * MiB);
  expect_thread_safe_device_memory(r->properties(), /*host_accessible=*/false);
  stream s(0);
  void* p = r->allocate(3 * MiB, s);
  device_fill(p, 3 * MiB, 0x77, s);
  EXPECT_EQ(device_count_mismatches(p, 3 * MiB, 0x77, s), 0U);
  EXPECT_EQ(vmm->statistics().allocations, 1U);
  EXPECT_GE(vmm->statistics().mapped_bytes, 3 * MiB);
  r->deallocate(p, 3 * MiB, s);
  s.synchronize();
  EXPECT_EQ(vmm->statistics().allocations, 0U);
  EXPECT_EQ(vmm->statistics().used_bytes, 0U);

  auto keep_all = make_resource_from_config("vmm", 0);
  EXPECT_EQ(dynamic_cast<vmm_pool_resource*>(keep_all.get())->options().release_threshold_bytes,
            std::numeric_limits<std::size_t>::max());
}

// Walks a stack down to its base through the adaptors' upstream().
memory_resource& base_of(memory_resource& r) {
  memory_resource* m = &r;
  while (auto* a = dynamic_cast<resource_adaptor*>(m)) m = &a->upstream();
  return *m;
}

// Through a whole stack: 1 MiB allocated, written and read back on the device and
// counted by the statistics; `over_limit` bytes refused by the limit; the 1 MiB
// freed and the log flushed.
void exercise_stack(memory_resource& r, statistics_adaptor& stats, logging_adaptor& log, std::size_t over_limit,
                    std::uint8_t pattern) {
  stream s(0);
  void* p = r.allocate(MiB, s);
  device_fill(p, MiB, pattern, s);
  EXPECT_EQ(device_count_mismatches(p, MiB, pattern, s), 0U);
  EXPECT_EQ(stats.statistics().current_bytes, MiB);
  EXPECT_THROW(r.allocate(over_limit, s), out_of_memory) << "the limit is in the stack";
  r.deallocate(p, MiB, s);
  s.synchronize();
  log.flush();
}

// Dropping the stack reports its statistics (the 1 MiB peak of exercise_stack).
void expect_statistics_reported_when_dropped(std::shared_ptr<memory_resource>& r) {
  testing::internal::CaptureStderr();
  r.reset();
  EXPECT_NE(testing::internal::GetCapturedStderr().find("statistics (GPUMEM_CONF): peak 1.00 MiB"),
            std::string::npos);
}

TEST(Config, EveryAdaptorWorksOverTheNewBases) {
  for (const char* base : {"async", "managed", "vmm"}) {
    SCOPED_TRACE(base);
    temp_path file("conf-base.csv");
    auto r = make_resource_from_config(std::string(base) + ",limit=8M,defer,track,stats,log=" + file.str(), 0);
    auto* log = dynamic_cast<logging_adaptor*>(r.get());
    ASSERT_NE(log, nullptr);
    auto* stats = dynamic_cast<statistics_adaptor*>(&log->upstream());
    ASSERT_NE(stats, nullptr);
    auto* track = dynamic_cast<tracking_adaptor*>(&stats->upstream());
    ASSERT_NE(track, nullptr);
    auto* defer = dynamic_cast<deferred_free_adaptor*>(&track->upstream());
    ASSERT_NE(defer, nullptr);
    auto* limit = dynamic_cast<limiting_adaptor*>(&defer->upstream());
    ASSERT_NE(limit, nullptr);
    EXPECT_EQ(limit->limit_bytes(), 8 * MiB);
    memory_resource& b = base_of(*r);
    EXPECT_EQ(&b, &limit->upstream());
    const bool right_type = std::string_view(base) == "async"     ? dynamic_cast<async_resource*>(&b) != nullptr
                            : std::string_view(base) == "managed" ? dynamic_cast<managed_resource*>(&b) != nullptr
                                                                  : dynamic_cast<vmm_pool_resource*>(&b) != nullptr;
    EXPECT_TRUE(right_type) << "the stack's base is the resource " << base << " names";
    EXPECT_EQ(r->properties().host_accessible, std::string_view(base) == "managed") << "the base's properties show through";

    exercise_stack(*r, *stats, *log, 8 * MiB, 0x11);
    const csv_file csv = read_csv(file.str());
    EXPECT_EQ(csv.rows.size(), 3U) << "allocate, the refused allocate, free";
    for (const auto& row : csv.rows) EXPECT_EQ(row.at("source"), "app");
    expect_statistics_reported_when_dropped(r);
  }
}

TEST(Config, TheDeviceMemoryHookWrapsWhatTakesMemoryFromTheDriver) {
  for (const char* base : {"cuda", "pool", "managed", "async", "vmm"}) {
    SCOPED_TRACE(base);
    int calls = 0;
    std::string wrapped;
    config_hooks hooks;
    hooks.wrap_device_memory = [&](std::shared_ptr<memory_resource> up) {
      ++calls;
      if (dynamic_cast<cuda_resource*>(up.get()) != nullptr) wrapped = "cuda";
      if (dynamic_cast<managed_resource*>(up.get()) != nullptr) wrapped = "managed";
      return std::shared_ptr<memory_resource>(std::make_shared<statistics_adaptor>(std::move(up)));
    };
    auto r = make_resource_from_config(base, 0, hooks);
    const std::string_view b(base);
    if (b == "async" || b == "vmm") {
      EXPECT_EQ(calls, 0) << "the pool takes its memory inside the resource";
      continue;
    }
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(wrapped, b == "managed" ? "managed" : "cuda");
    void* p = r->allocate(MiB, stream_view{});
    r->deallocate(p, MiB, stream_view{});
  }
}

TEST(Config, SizesAreBytesOrPercentOfTheDevice) {
  const std::size_t total = device_memory_info(0).total_bytes;
  auto r = make_resource_from_config("pool,initial=1%,maximum=2%", 0);
  auto* pool = dynamic_cast<pool_resource*>(r.get());
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->options().maximum_bytes, total / 50);
  EXPECT_GE(pool->statistics().reserved_bytes, total / 100);
  EXPECT_LE(pool->statistics().reserved_bytes, total / 100 + 256);
  auto l = make_resource_from_config("cuda,limit=3MiB", 0);
  ASSERT_NE(dynamic_cast<limiting_adaptor*>(l.get()), nullptr);
  EXPECT_EQ(dynamic_cast<limiting_adaptor*>(l.get())->limit_bytes(), 3 * MiB);
  for (const char* s : {"64k", "64K", "64KiB", "64kb"}) {
    auto p = make_resource_from_config(std::string("pool,min_chunk=") + s + ",max_chunk=1M", 0);
    EXPECT_EQ(dynamic_cast<pool_resource*>(p.get())->options().min_chunk_bytes, 64U << 10) << s;
  }
  EXPECT_THROW(make_resource_from_config("pool,initial=2G,maximum=1G", 0), logic_error)
      << "the pool's own checks come back as configuration errors";
}

TEST(Config, TheWholeStackWorks) {
  temp_path file("conf.csv");
  auto r = make_resource_from_config("pool,initial=4M,limit=64M,defer,track,stats,log=" + file.str(), 0);
  EXPECT_EQ(r->properties().device, 0);
  EXPECT_TRUE(r->properties().thread_safe);
  auto* log = dynamic_cast<logging_adaptor*>(r.get());
  ASSERT_NE(log, nullptr);
  auto* stats = dynamic_cast<statistics_adaptor*>(&log->upstream());
  ASSERT_NE(stats, nullptr);
  exercise_stack(*r, *stats, *log, 65 * MiB, 0x5E);
  const csv_file csv = read_csv(file.str());
  std::size_t upstream_rows = 0;
  for (const auto& row : csv.rows) upstream_rows += row.at("source") == "upstream" ? 1 : 0;
  EXPECT_EQ(upstream_rows, 1U) << "the pool's initial chunk";
  EXPECT_EQ(csv.rows.size(), 4U);
  expect_statistics_reported_when_dropped(r);
}

TEST(Config, TheDefaultCurrentResourceFollowsGpumemConf) {
  auto before = set_current_resource(0, nullptr);
  {
    scoped_env conf("GPUMEM_CONF", "cuda,limit=5MiB,defer");
    set_current_resource(0, nullptr);  // the default is made again on next use
    auto r = get_current_resource(0);
    auto* d = dynamic_cast<deferred_free_adaptor*>(r.get());
    ASSERT_NE(d, nullptr) << "GPUMEM_CONF was not honoured";
    EXPECT_NE(dynamic_cast<limiting_adaptor*>(&d->upstream()), nullptr);
    EXPECT_THROW(r->allocate(6 * MiB, stream_view{}), out_of_memory);
  }
  {
    scoped_env conf("GPUMEM_CONF", "pool,maximum=banana");
    set_current_resource(0, nullptr);
    try {
      get_current_resource(0);
      ADD_FAILURE() << "a bad GPUMEM_CONF was accepted";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("banana"), std::string::npos) << e.what();
    }
  }
  {
    scoped_env conf("GPUMEM_CONF", "vmm,stats");
    set_current_resource(0, nullptr);
    auto r = get_current_resource(0);
    auto* st = dynamic_cast<statistics_adaptor*>(r.get());
    ASSERT_NE(st, nullptr);
    EXPECT_NE(dynamic_cast<vmm_pool_resource*>(&st->upstream()), nullptr);
    void* p = r->allocate(MiB, stream_view{});
    r->deallocate(p, MiB, stream_view{});
    testing::internal::CaptureStderr();
    set_current_resource(0, nullptr);
    r.reset();
    testing::internal::GetCapturedStderr();
  }
  {
    scoped_env conf("GPUMEM_CONF", "");
    set_current_resource(0, nullptr);
    EXPECT_NE(dynamic_cast<vmm_pool_resource*>(get_current_resource(0).get()), nullptr) << "empty: the default";
  }
  set_current_resource(0, before);
}

}  // namespace
}  // namespace gpumem::test
