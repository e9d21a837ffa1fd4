// Compile-time checks of the torch the extension is built against, for the
// interface differences between the versions we support (2.11 to 2.14).
#pragma once

#include <torch/headeronly/version.h>

// Interface additions after 2.11, by the release whose headers show them.
#define ALLOCSCOPE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
