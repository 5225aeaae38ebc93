// A tiny CUDA extension for the smoke image. It is compiled in a builder
// stage with the -gencode flags that qualify/arch.py derives from the target's
// TORCH_CUDA_ARCH_LIST, so its cubins prove the arch-list wiring.
#include <cuda_runtime.h>

__global__ void smoke_saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" int smoke_saxpy_host(int n, float a, const float* x, float* y) {
  float *dx = nullptr, *dy = nullptr;
  size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (cudaMalloc(&dx, bytes) != cudaSuccess || cudaMalloc(&dy, bytes) != cudaSuccess) return 1;
  cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y, bytes, cudaMemcpyHostToDevice);
  smoke_saxpy<<<(n + 255) / 256, 256>>>(n, a, dx, dy);
  cudaError_t err = cudaGetLastError();
  cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  return err == cudaSuccess ? 0 : 2;
}
