// gpumem-report's page for several logs, one per process (Dask workers, torchrun
// ranks): one chart per log, stacked on one time scale and one byte scale, one
// legend for all, and a table of every log's figures.
#pragma once

#include <string>
#include <vector>

#include "report/html.hpp"
#include "report/timeline.hpp"

namespace gpumem::tools {

struct named_timeline {
  std::string name;  // what the page calls the log: its file name
  timeline tl;
};

std::string render_multi_log_html(const std::vector<named_timeline>& logs, const page_options& options);

// The page's height in pixels at its own width, for a screenshot of all of it.
int multi_log_page_height(const std::vector<named_timeline>& logs);

// Each log's name for the page: its file name, or the path as given where two
// logs share a file name.
std::vector<std::string> log_display_names(const std::vector<std::string>& paths);

}  // namespace gpumem::tools
