// A stand-in for vLLM's _moe_C: the Marlin MoE kernel family (marlin_moe_wna16::Marlin).
namespace marlin_moe_wna16 {
template <int B> __global__ void Marlin(float *x, int n) {
  float a = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 256; ++i) a = a * 0.998f + x[(threadIdx.x * 5 + i) % n];
  x[threadIdx.x] = a;
}
template __global__ void Marlin<4>(float *, int);
}  // namespace marlin_moe_wna16
