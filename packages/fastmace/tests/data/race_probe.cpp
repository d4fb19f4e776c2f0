// A tiny pybind11 extension for the build-once race test: real compiler, real torch builder,
// seconds to build (it does not include torch's headers).
#include <pybind11/pybind11.h>

static int answer() { return 42; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) { module.def("answer", &answer); }
