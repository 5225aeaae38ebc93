// A stand-in for DeepGEMM's host library (vllm/third_party/deep_gemm/_C_extension.abi3.so): its dispatch is
// C++ runtimes per architecture, and a build without SM120's raises "Unsupported architecture" there.
namespace deep_gemm {
struct SM90FP8Gemm1D2DRuntime { static int compile_and_launch(int x) { return x + 90; } };
struct SM100FP8FP4Gemm1D1DRuntime { static int compile_and_launch(int x) { return x + 100; } };
#ifdef WITH_SM120
struct SM120FP8FP4Gemm1D1DRuntime { static int compile_and_launch(int x) { return x + 120; } };
#endif
int dispatch(int arch, int x) {
  if (arch == 90) return SM90FP8Gemm1D2DRuntime::compile_and_launch(x);
  if (arch == 100) return SM100FP8FP4Gemm1D1DRuntime::compile_and_launch(x);
#ifdef WITH_SM120
  if (arch == 120) return SM120FP8FP4Gemm1D1DRuntime::compile_and_launch(x);
#endif
  throw "Unsupported architecture";
}
}  // namespace deep_gemm
__attribute__((visibility("default"))) int (*deep_gemm_dispatch)(int, int) = deep_gemm::dispatch;
