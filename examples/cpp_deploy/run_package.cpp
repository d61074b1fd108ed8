// Runs an AOTInductor package of a spconv model from C++ (no Python): reads features [N, C] float32 and
// indices [N, 4] int32 from raw files, runs the package and prints one checksum line per output, the same
// lines spconv.deploy.checksum_lines prints in Python.
//   run_package model.pt2 features.f32 indices.i32 C [repeat]
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

// ATen, not <torch/torch.h>: the program needs tensors, not the C++ frontend, whose headers would be most of
// its compile time.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <spconv/ops.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error(std::string("cannot read ") + path);
  std::vector<char> data(static_cast<size_t>(f.tellg()));
  f.seekg(0);
  f.read(data.data(), static_cast<std::streamsize>(data.size()));
  return data;
}

at::Tensor tensor_from_file(const char* path, int64_t cols, at::ScalarType dtype) {
  std::vector<char> data = read_file(path);
  const int64_t row_bytes = cols * static_cast<int64_t>(c10::elementSize(dtype));
  if (data.size() % row_bytes != 0) throw std::runtime_error(std::string(path) + ": not whole rows");
  const int64_t rows = static_cast<int64_t>(data.size()) / row_bytes;
  return at::from_blob(data.data(), {rows, cols}, dtype).clone();
}

// Same digest as spconv.deploy.checksum: sum of word[i] * (i mod 1000003 + 1) over the 32-bit words.
std::string checksum(const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu();
  const auto* words = static_cast<const uint32_t*>(c.data_ptr());
  const int64_t n = static_cast<int64_t>(c.nbytes() / 4);
  uint64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<uint64_t>(words[i]) * static_cast<uint64_t>(i % 1000003 + 1);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, total);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s model.pt2 features.f32 indices.i32 channels [repeat]\n", argv[0]);
    return 2;
  }
  const int64_t channels = std::atoll(argv[4]);
  const int repeat = argc > 5 ? std::atoi(argv[5]) : 1;
  std::fprintf(stderr, "spconv %s\n", spconv_build_info());  // also keeps the op library linked

  std::vector<at::Tensor> inputs = {tensor_from_file(argv[2], channels, at::kFloat),
                                    tensor_from_file(argv[3], 4, at::kInt)};
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  c10::InferenceMode guard;
  std::vector<at::Tensor> outputs = loader.run(inputs);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    outputs = loader.run(inputs);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string shape;
    for (int64_t d = 0; d < outputs[i].dim(); ++d) shape += (d ? "x" : "") + std::to_string(outputs[i].size(d));
    std::printf("output %zu %s %s\n", i, shape.c_str(), checksum(outputs[i]).c_str());
  }
  std::fprintf(stderr, "run_s %.6f\n", best);
  return 0;
}
