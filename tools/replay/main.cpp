// gpumem-replay: replays a gpumem event log against any resource (a GPUMEM_CONF
// string), optionally on a simulated device of a given size, and reports the
// time, the peak of live and of reserved bytes, and the failures.
// docs/observability.md ("Replaying a log") describes it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/event_log_reader.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "replay/replay.hpp"

namespace {

const char* usage =
    "usage: gpumem-replay LOG [options]\n"
    "  --resource CONF        resource to replay against, GPUMEM_CONF grammar (default: pool)\n"
    "  --device-memory SIZE   run on the simulator with devices of SIZE bytes (e.g. 16GiB)\n"
    "  --device N             device to replay on (default 0)\n"
    "  --order seq|thread     seq: the log's global order, exact peaks (default);\n"
    "                         thread: each thread in its own order, frees wait for their allocation\n"
    "  --source NAME          rows to replay (default: app)\n"
    "  --json FILE            also write the results as JSON\n"
    "exit status: 0 replayed (allocation failures included), 1 error, 2 bad arguments\n";

}  // namespace

int main(int argc, char** argv) {
  std::string log_path, json_path, device_memory;
  gpumem::tools::replay_options options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpumem-replay: %s needs a value\n%s", a.c_str(), usage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--resource") options.resource = value();
    else if (a == "--device-memory") device_memory = value();
    else if (a == "--device") options.device = std::atoi(value().c_str());
    else if (a == "--source") options.source = value();
    else if (a == "--json") json_path = value();
    else if (a == "--order") {
      const std::string o = value();
      if (o == "seq") options.order = gpumem::tools::replay_order::seq;
      else if (o == "thread") options.order = gpumem::tools::replay_order::thread;
      else {
        std::fprintf(stderr, "gpumem-replay: --order takes seq or thread, not \"%s\"\n", o.c_str());
        return 2;
      }
    } else if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "gpumem-replay: unknown option %s\n%s", a.c_str(), usage);
      return 2;
    } else if (log_path.empty()) {
      log_path = a;
    } else {
      std::fprintf(stderr, "gpumem-replay: one log at a time\n%s", usage);
      return 2;
    }
  }
  if (log_path.empty()) {
    std::fputs(usage, stderr);
    return 2;
  }
  try {
    // The simulated device size must be in the environment before the backend starts.
    gpumem::backend_kind kind;
    if (!device_memory.empty()) {
      ::setenv("GPUMEM_SIM_MEMORY", device_memory.c_str(), 1);
      ::setenv("GPUMEM_BACKEND", "sim", 1);
      kind = gpumem::select_backend(gpumem::backend_choice::sim);
    } else {
      const bool from_env = std::getenv("GPUMEM_BACKEND") != nullptr;
      kind = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
      if (kind == gpumem::backend_kind::sim && !from_env) {
        std::printf("gpumem-replay: no usable CUDA driver or GPU here; replaying on the host simulator\n");
      }
    }
    const auto events = gpumem::tools::read_event_log(log_path);
    const auto info = gpumem::device_memory_info(options.device);
    const auto r = gpumem::tools::replay_events(events, options);
    using gpumem::tools::human_bytes;
    std::printf("gpumem-replay: %s: %zu events, %zu thread(s), %zu stream(s)\n", log_path.c_str(),
                r.events_in_log, r.threads, r.streams);
    std::printf("resource:       %s on %s device %d (%s), order %s\n", options.resource.c_str(),
                std::string(gpumem::to_string(kind)).c_str(), options.device,
                human_bytes(static_cast<double>(info.total_bytes)).c_str(),
                options.order == gpumem::tools::replay_order::seq ? "seq" : "thread");
    std::printf("time:           %.3f ms for %zu calls (%.1f us per call)\n", r.seconds * 1e3, r.replayed,
                r.replayed > 0 ? r.seconds * 1e6 / static_cast<double>(r.replayed) : 0.0);
    std::printf("peak live:      %llu bytes (%s); in the log: %llu bytes\n",
                static_cast<unsigned long long>(r.peak_live_bytes),
                human_bytes(static_cast<double>(r.peak_live_bytes)).c_str(),
                static_cast<unsigned long long>(r.log_peak_live_bytes));
    if (r.reserved_counted) {
      std::printf("peak reserved:  %llu bytes (%s)", static_cast<unsigned long long>(r.peak_reserved_bytes),
                  human_bytes(static_cast<double>(r.peak_reserved_bytes)).c_str());
    } else {
      std::printf("peak reserved:  not counted (this base's pool takes device memory inside the resource)");
    }
    if (r.log_peak_reserved_bytes > 0) {
      std::printf("; in the log: %llu bytes", static_cast<unsigned long long>(r.log_peak_reserved_bytes));
    }
    std::printf("\nfailures:       %zu allocation(s) of %zu failed\n", r.failures, r.allocations + r.failures);
    for (const auto& m : r.failure_messages) std::printf("                %s\n", m.c_str());
    std::printf("skipped:        %zu row(s) (failed in the log, other sources, or frees of allocations not replayed)\n",
                r.skipped);
    if (r.left_live > 0) std::printf("left live:      %zu allocation(s) the log never freed\n", r.left_live);
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << "{\"tool\":\"gpumem-replay\",\"log\":\"" << log_path << "\",\"resource\":\"" << options.resource
          << "\",\"backend\":\"" << gpumem::to_string(kind) << "\",\"device_total_bytes\":" << info.total_bytes
          << ",\"order\":\"" << (options.order == gpumem::tools::replay_order::seq ? "seq" : "thread")
          << "\",\"events\":" << r.events_in_log << ",\"replayed\":" << r.replayed
          << ",\"threads\":" << r.threads << ",\"streams\":" << r.streams << ",\"seconds\":" << r.seconds
          << ",\"peak_live_bytes\":" << r.peak_live_bytes << ",\"log_peak_live_bytes\":" << r.log_peak_live_bytes
          << ",\"peak_reserved_bytes\":" << r.peak_reserved_bytes
          << ",\"reserved_counted\":" << (r.reserved_counted ? "true" : "false")
          << ",\"log_peak_reserved_bytes\":" << r.log_peak_reserved_bytes << ",\"failures\":" << r.failures
          << ",\"skipped\":" << r.skipped << ",\"left_live\":" << r.left_live << "}\n";
      if (!out) {
        std::fprintf(stderr, "gpumem-replay: cannot write %s\n", json_path.c_str());
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-replay: %s\n", e.what());
    return 1;
  }
}
