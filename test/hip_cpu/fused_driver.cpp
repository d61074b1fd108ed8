// Runs the fused-route launchers (csrc/hip/fused_conv.cu, built for HIP-CPU) on arrays from the test.
// usage: fused_driver forward|dfilter f32|f16|bf16 DIR
//   DIR/meta.txt: n_in n_out kvol cin cout npairs splits
//   DIR: x.bin, pair_in.bin (int32), pair_out.bin (int32), pair_offsets.bin (int64, kvol + 1), and
//   forward: w.bin [kvol, cin, cout], order.bin (int32 [splits, n_out]) -> y.bin [n_out, cout]
//   dfilter: dy.bin [n_out, cout] -> dw.bin [kvol, cin, cout]
// Prints fused_forward_path for the dtype. Buffers are 64-byte aligned, so 16-bit data with channels a
// multiple of 8 takes the kernels' vector loads.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "launchers.h"

namespace {

using spconv::gpu::DType;

void* alloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64); }

void* read_file(const std::string& path, size_t bytes) {
  void* p = alloc(bytes);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(p, 1, bytes, f) != bytes) {
    std::fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path.c_str());
    std::exit(3);
  }
  std::fclose(f);
  return p;
}

void write_file(const std::string& path, const void* p, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(p, 1, bytes, f) != bytes) std::exit(3);
  std::fclose(f);
}

void check(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "%s returned %d\n", what, rc);
    std::exit(4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s forward|dfilter f32|f16|bf16 DIR\n", argv[0]);
    return 2;
  }
  const std::string op = argv[1], ty = argv[2], dir = std::string(argv[3]) + "/";
  const DType t = ty == "f32" ? DType::F32 : ty == "f16" ? DType::F16 : DType::BF16;
  const size_t es = t == DType::F32 ? 4 : 2;
  long long n_in, n_out, kvol, cin, cout, npairs, splits;
  FILE* m = std::fopen((dir + "meta.txt").c_str(), "r");
  if (!m || std::fscanf(m, "%lld %lld %lld %lld %lld %lld %lld", &n_in, &n_out, &kvol, &cin, &cout, &npairs,
                        &splits) != 7)
    return 3;
  std::fclose(m);
  std::printf("path %s\n", spconv::gpu::fused_forward_path(t));
  const void* x = read_file(dir + "x.bin", n_in * cin * es);
  auto* pin = static_cast<const int32_t*>(read_file(dir + "pair_in.bin", npairs * 4));
  auto* pout = static_cast<const int32_t*>(read_file(dir + "pair_out.bin", npairs * 4));
  auto* poff = static_cast<const int64_t*>(read_file(dir + "pair_offsets.bin", (kvol + 1) * 8));
  if (op == "forward") {
    const void* w = read_file(dir + "w.bin", kvol * cin * cout * es);
    auto* order = static_cast<const int32_t*>(read_file(dir + "order.bin", splits * n_out * 4));
    auto* nbr = static_cast<int32_t*>(alloc(n_out * kvol * 4));
    for (long long i = 0; i < n_out * kvol; ++i) nbr[i] = -1;
    auto* masks = static_cast<int32_t*>(alloc(splits * n_out * 4));
    void* y = alloc(n_out * cout * es);
    std::memset(y, 0xff, n_out * cout * es);  // NaN in every dtype: rows left unwritten show
    check(spconv::gpu::fused_map_fill(pin, pout, poff, kvol, npairs, n_out, nbr, nullptr), "fused_map_fill");
    check(spconv::gpu::fused_map_masks(nbr, n_out, kvol, int(splits), masks, nullptr), "fused_map_masks");
    check(spconv::gpu::fused_conv_forward(t, x, w, nbr, masks, order, n_out, kvol, cin, cout, int(splits), y,
                                          nullptr),
          "fused_conv_forward");
    write_file(dir + "y.bin", y, n_out * cout * es);
  } else {
    const void* dy = read_file(dir + "dy.bin", n_out * cout * es);
    auto* ws = static_cast<float*>(alloc(kvol * splits * cin * cout * 4));
    for (long long i = 0; i < kvol * splits * cin * cout; ++i) ws[i] = NAN;
    void* dw = alloc(kvol * cin * cout * es);
    check(spconv::gpu::fused_conv_dfilter(t, x, dy, pin, pout, poff, kvol, cin, cout, int(splits), ws, dw, nullptr),
          "fused_conv_dfilter");
    write_file(dir + "dw.bin", dw, kvol * cin * cout * es);
  }
  return 0;
}
