// Does a std::regex compiled by this machine's g++ work inside the GPU machine's Python once
// torch is imported? AOTInductor's package library crashed compiling one (stage 47's backtrace:
// parse_device_str -> std::regex); this tells the toolchain from torch's generated wrapper.
//
//   g++ -shared -fPIC -O2 -std=c++17 -o /tmp/regex_probe.so tools/validation/regex_probe.cpp
//   python3 -c "import torch, ctypes; print(ctypes.CDLL('/tmp/regex_probe.so').probe())"
#include <regex>
#include <string>

extern "C" int probe() {
  std::regex pattern("(cpu|cuda|xpu)(:([0-9]+))?");
  std::smatch match;
  std::string text = "cuda:0";
  return std::regex_match(text, match, pattern) ? 1 : 0;
}
