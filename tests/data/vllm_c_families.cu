// A stand-in for vLLM's _C: kernels whose mangled names are those of the families the provider rules name.
namespace cutlass {
struct float_e4m3_t {}; struct float_e2m1_t {}; struct float_ue4m3_t {};
namespace gemm {
template <int A, int B> struct MainloopSm120TmaWarpSpecialized {};
template <int A, int B> struct MainloopSm120TmaWarpSpecializedBlockScaled {};
template <int A, int B> struct MainloopSm120ArrayTmaWarpSpecializedBlockScaled {};
struct KernelTmaWarpSpecializedBlockwiseCooperativeSm120 {};
}  // namespace gemm
template <class Mainloop, class T> __global__ void device_kernel(float *x, int n) {
  float a = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 256; ++i) a = a * 1.0001f + x[(threadIdx.x * 7 + i) % n];
  x[threadIdx.x] = a;
}
}  // namespace cutlass
namespace vllm { template <class Schedule> struct cutlass_3x_gemm_fp8_blockwise {}; }
namespace marlin {
template <int B> __global__ void Marlin(float *x, int n) {
  float a = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 256; ++i) a = a * 0.999f + x[(threadIdx.x * 3 + i) % n];
  x[threadIdx.x] = a;
}
template __global__ void Marlin<4>(float *, int);
}  // namespace marlin
namespace cutlass {
template __global__ void device_kernel<gemm::MainloopSm120TmaWarpSpecialized<2, 2>, float_e4m3_t>(float *, int);
template __global__ void device_kernel<gemm::MainloopSm120TmaWarpSpecializedBlockScaled<3, 3>, float_e2m1_t>(float *, int);
template __global__ void device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<gemm::KernelTmaWarpSpecializedBlockwiseCooperativeSm120>, float_e4m3_t>(float *, int);
#ifdef NVFP4_MOE
template __global__ void device_kernel<gemm::MainloopSm120ArrayTmaWarpSpecializedBlockScaled<4, 3>, float_e2m1_t>(float *, int);
#else
// The same kernel guarded out (what another architecture's cubin holds): its name, and an immediate exit.
template <> __global__ void device_kernel<gemm::MainloopSm120ArrayTmaWarpSpecializedBlockScaled<4, 3>, float_e2m1_t>(float *, int) {}
#endif
}  // namespace cutlass
