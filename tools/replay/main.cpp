// gpumem-replay: replays a gpumem event log against any resource (a GPUMEM_CONF
// string), optionally on a simulated device of a given size, and reports the
// time, the peak of live and of reserved bytes, and the failures.
// docs/observability.md ("Replaying a log") describes it.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command_line.hpp"
#include "common/event_log_reader.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "replay/replay.hpp"

namespace {

constexpr const char* description =
    "Replays a gpumem event log against any resource (a GPUMEM_CONF string), optionally\n"
    "on a simulated device of a given size, and reports the time, the peak of live and\n"
    "of reserved bytes, and the failures (docs/observability.md, \"Replaying a log\").";
constexpr const char* epilog =
    "environment: GPUMEM_BACKEND=cuda|sim chooses the backend (--device-memory: the\n"
    "simulator); unset, the CUDA driver when a GPU is usable, else the simulator.\n"
    "exit status: 0 replayed (allocation failures included), 1 error, 2 bad arguments";

}  // namespace

int main(int argc, char** argv) {
  std::string log_path, json_path, device_memory, order = "seq";
  gpumem::tools::replay_options options;
  CLI::App app(description, "gpumem-replay");
  gpumem::tools::apply_conventions(app, epilog);
  app.add_option("LOG", log_path, "the event log (CSV) to replay")->type_name("FILE")->required();
  app.add_option("--resource", options.resource,
                 "resource to replay against, GPUMEM_CONF grammar\n(default: pool)")
      ->type_name("CONF");
  app.add_option("--device-memory", device_memory,
                 "run on the simulator with devices of SIZE bytes\n(e.g. 16GiB)")
      ->type_name("SIZE");
  app.add_option("--device", options.device, "device to replay on (default 0)")
      ->type_name("N")
      ->check(gpumem::tools::whole_number(0, INT_MAX));
  app.add_option("--order", order,
                 "seq: the log's global order, exact peaks (default);\n"
                 "thread: each thread in its own order, frees wait\nfor their allocation")
      ->type_name("seq|thread")
      ->check(CLI::Validator(
          [](std::string& o) -> std::string {
            return o == "seq" || o == "thread" ? "" : "takes seq or thread, not \"" + o + "\"";
          },
          "", "seq or thread"));
  app.add_option("--source", options.source, "rows to replay (default: app)")->type_name("NAME");
  app.add_option("--json", json_path, "also write the results as JSON")->type_name("FILE");
  if (const auto stop = gpumem::tools::parse_command_line(app, argc, argv)) return *stop;
  options.order = order == "thread" ? gpumem::tools::replay_order::thread : gpumem::tools::replay_order::seq;
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
      const nlohmann::ordered_json doc = {
          {"tool", "gpumem-replay"},
          {"log", log_path},
          {"resource", options.resource},
          {"backend", std::string(gpumem::to_string(kind))},
          {"device_total_bytes", info.total_bytes},
          {"order", order},
          {"events", r.events_in_log},
          {"replayed", r.replayed},
          {"threads", r.threads},
          {"streams", r.streams},
          {"seconds", r.seconds},
          {"peak_live_bytes", r.peak_live_bytes},
          {"log_peak_live_bytes", r.log_peak_live_bytes},
          {"peak_reserved_bytes", r.peak_reserved_bytes},
          {"reserved_counted", r.reserved_counted},
          {"log_peak_reserved_bytes", r.log_peak_reserved_bytes},
          {"failures", r.failures},
          {"skipped", r.skipped},
          {"left_live", r.left_live}};
      std::ofstream out(json_path);
      out << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
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
