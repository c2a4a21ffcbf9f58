// gpumem-report's page: one self-contained HTML file (inline CSS and SVG, no
// script, nothing fetched) with the memory timeline and a summary.
#pragma once

#include <string>

#include "report/timeline.hpp"

namespace gpumem::tools {

struct page_options {
  std::string title = "gpumem memory timeline";
  std::string source_name;  // the log's file name, shown under the title
  std::string grouping_name = "size class";
};

std::string render_html(const timeline& tl, const page_options& options);

// The chart's colours, bottom group first (the tests look for them in screenshots).
const std::vector<std::string>& group_palette();

}  // namespace gpumem::tools
