// A stand-in for sgl_kernel's common_ops: an RMSNorm like the one every model runs first, and kernels whose
// mangled names are those of the sgl_kernel families SGLang's rules name (measured on sglang-kernel 0.4.10's
// sgl_kernel/sm100/common_ops.abi3.so: cutlass::device_kernel<...MainloopSm100TmaUmmaWarpSpecialized<17,2,4,...>
// ...float_e4m3_t...> for fp8_scaled_mm on SM100, cutlass_3x_gemm_sm90_fp8<...> on SM90).
namespace cutlass {
struct float_e4m3_t {};
namespace gemm {
template <int A, int B, int C> struct MainloopSm100TmaUmmaWarpSpecialized {};
}  // namespace gemm
template <class Mainloop, class T> __global__ void device_kernel(float *x, int n) {
  float a = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 256; ++i) a = a * 1.0001f + x[(threadIdx.x * 7 + i) % n];
  x[threadIdx.x] = a;
}
#ifdef SM100_FP8
template __global__ void device_kernel<gemm::MainloopSm100TmaUmmaWarpSpecialized<17, 2, 4>, float_e4m3_t>(float *, int);
#else
// Guarded out (a build without the SM100 FP8 GEMM): its name, and an immediate exit.
template <> __global__ void device_kernel<gemm::MainloopSm100TmaUmmaWarpSpecialized<17, 2, 4>, float_e4m3_t>(float *, int) {}
#endif
}  // namespace cutlass
template <class T> struct cutlass_3x_gemm_sm90_fp8 {};
namespace cutlass {
template __global__ void device_kernel<cutlass_3x_gemm_sm90_fp8<float_e4m3_t>, float_e4m3_t>(float *, int);
}  // namespace cutlass
namespace flashinfer { namespace norm {
template <int VEC> __global__ void RMSNormKernel(float *x, const float *w, int d, float eps) {
  float s = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) s += x[blockIdx.x * d + i] * x[blockIdx.x * d + i];
  float r = rsqrtf(s / d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) x[blockIdx.x * d + i] *= r * w[i];
}
template __global__ void RMSNormKernel<8>(float *, const float *, int, float);
}}  // namespace flashinfer::norm
