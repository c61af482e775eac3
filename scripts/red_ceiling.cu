// On the GPU (nvcc -arch=sm_90a -O3 scripts/red_ceiling.cu -o /tmp/rc && /tmp/rc): the L2's rate for the
// backward's dKV reductions by instruction kind: per-thread red.global.add.v4.f32 (what the kernels use) against
// TMA bulk reductions (cp.reduce.async.bulk ... add.f32, 512 B a row piece from shared memory) and plain 16-byte
// stores to the same random rows. 4096 query rows x 2048 distinct indices x 512 fp32 columns = 17.2 GB a call.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <numeric>
#include <random>
#include <cuda_runtime.h>

constexpr int S_Q = 4096, S_KV = 8192, TOPK = 2048, D = 576;

__global__ void red_v4(float* dst, const int* idx) {
  int c = blockIdx.x, r = blockIdx.y, lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  for (int t = w; t < TOPK; t += nw) {
    float* p = dst + (size_t)idx[r * TOPK + t] * D + c * 128 + lane * 4;
    asm volatile("red.global.add.v4.f32 [%0], {%1, %1, %1, %1};" ::"l"(p), "f"(1.0f) : "memory");
  }
}

__global__ void st_v4(float* dst, const int* idx) {
  int c = blockIdx.x, r = blockIdx.y, lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  for (int t = w; t < TOPK; t += nw) {
    float* p = dst + (size_t)idx[r * TOPK + t] * D + c * 128 + lane * 4;
    asm volatile("st.global.v4.f32 [%0], {%1, %1, %1, %1};" ::"l"(p), "f"(1.0f) : "memory");
  }
}

template <int BYTES>
__global__ void red_bulk(float* dst, const int* idx) {
  __shared__ __align__(128) float buf[BYTES / 4];
  int c = blockIdx.x, r = blockIdx.y;
  for (int i = threadIdx.x; i < BYTES / 4; i += blockDim.x) buf[i] = 1.0f;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  unsigned s = (unsigned)__cvta_generic_to_shared(buf);
  for (int t = threadIdx.x; t < TOPK * 512 / BYTES; t += blockDim.x) {
    int row = t * BYTES / 512, part = t % (512 / BYTES);
    float* p = dst + (size_t)idx[r * TOPK + row] * D + c * 128 + part * BYTES / 4;
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(p), "r"(s),
                 "n"(BYTES) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

template <typename F>
float timeit(F f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; i++) f();
  std::vector<float> ms;
  for (int i = 0; i < 15; i++) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main() {
  std::vector<int> h(S_Q * TOPK), perm(S_KV);
  std::mt19937 g(1);
  std::iota(perm.begin(), perm.end(), 0);
  for (int r = 0; r < S_Q; r++) {
    std::shuffle(perm.begin(), perm.end(), g);
    std::copy(perm.begin(), perm.begin() + TOPK, h.begin() + (size_t)r * TOPK);
  }
  int* idx;
  float* dst;
  cudaMalloc(&idx, h.size() * 4);
  cudaMalloc(&dst, (size_t)S_KV * D * 4);
  cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dst, 0, (size_t)S_KV * D * 4);
  double vol = (double)S_Q * TOPK * 512 * 4;
  dim3 grid(4, S_Q);
  auto show = [&](const char* name, float ms) {
    cudaError_t e = cudaGetLastError();
    printf("%-34s %7.3f ms %5.2f TB/s %s\n", name, ms, vol / ms / 1e9, e == cudaSuccess ? "" : cudaGetErrorString(e));
  };
  for (int th : {128, 256}) {
    char n[64];
    snprintf(n, 64, "red.v4.f32 %d threads", th);
    show(n, timeit([&] { red_v4<<<grid, th>>>(dst, idx); }));
    snprintf(n, 64, "st.v4.f32 %d threads", th);
    show(n, timeit([&] { st_v4<<<grid, th>>>(dst, idx); }));
    snprintf(n, 64, "bulk reduce 512 B %d threads", th);
    show(n, timeit([&] { red_bulk<512><<<grid, th>>>(dst, idx); }));
    snprintf(n, 64, "bulk reduce 256 B %d threads", th);
    show(n, timeit([&] { red_bulk<256><<<grid, th>>>(dst, idx); }));
    snprintf(n, 64, "bulk reduce 128 B %d threads", th);
    show(n, timeit([&] { red_bulk<128><<<grid, th>>>(dst, idx); }));
  }
  return 0;
}
