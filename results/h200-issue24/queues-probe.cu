// Probe (issue 24): how the CUDA driver spreads streams over its hardware queues
// (CUDA_DEVICE_MAX_CONNECTIONS), and what a blocked queue blocks.
// Build and run on the GPU machine:  nvcc -O2 -arch=sm_90 queues-probe.cu -lcuda -o probe
//   CUDA_DEVICE_MAX_CONNECTIONS=8 ./probe ; CUDA_DEVICE_MAX_CONNECTIONS=32 ./probe
// A stream is "blocked" by a cuStreamWaitValue32 on a flag in mapped host memory, which the host
// releases by a plain store (no queue needed). For each blocked stream i, every other stream j
// gets a tiny kernel: if it does not finish within 20 ms, i and j share a queue.
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <atomic>
#include <vector>
#define CK(x) do { auto r_ = (x); if ((int)r_ != 0) { printf("FAIL %s -> %d (line %d)\n", #x, (int)r_, __LINE__); exit(1); } } while (0)

__global__ void tick(int* p) { if (threadIdx.x == 0) atomicAdd(p, 1); }

static volatile unsigned* flag_host;
static CUdeviceptr flag_dev;
static unsigned epoch = 0;
static int* counter;

static bool done_within(cudaStream_t s, int ms) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms)) {
    if (cudaStreamQuery(s) == cudaSuccess) return true;
  }
  return false;
}
static void block(cudaStream_t s) { CK(cuStreamWaitValue32((CUstream)s, flag_dev, epoch + 1, CU_STREAM_WAIT_VALUE_GEQ)); }
static void release() { epoch++; *flag_host = epoch; __sync_synchronize(); }

// Row of the collision matrix: which streams j share a queue with stream i.
static std::vector<int> row(std::vector<cudaStream_t>& s, int i) {
  std::vector<int> shared;
  block(s[i]);
  for (int j = 0; j < (int)s.size(); j++) {
    if (j == i) continue;
    tick<<<1, 32, 0, s[j]>>>(counter);
    if (!done_within(s[j], 20)) shared.push_back(j);
  }
  release();
  CK(cudaDeviceSynchronize());
  return shared;
}

// Does `what` (a blocking call on another thread) finish within 200 ms while stream s is blocked?
template <class F> static bool finishes_while_blocked(cudaStream_t s, F what) {
  block(s);
  std::atomic<bool> done{false};
  std::thread t([&] { what(); done = true; });
  auto t0 = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(200)) std::this_thread::yield();
  bool ok = done;
  release();
  t.join();
  CK(cudaDeviceSynchronize());
  return ok;
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const char* env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n", env ? env : "(unset)");
  CK(cudaSetDevice(0)); CK(cudaFree(0));
  int can = 0; CK(cuDeviceGetAttribute(&can, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0));
  printf("64-bit stream memory ops: %d\n", can);
  void* h; CK(cuMemHostAlloc(&h, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  flag_host = (volatile unsigned*)h; *flag_host = 0;
  CK(cuMemHostGetDevicePointer(&flag_dev, h, 0));
  CK(cudaMalloc(&counter, 4));
  // Load the kernel before any stream is blocked: a lazy module load waits behind a blocked
  // queue (the first version of this probe hung there; run it with CUDA_MODULE_LOADING=EAGER).
  tick<<<1, 32>>>(counter);
  CK(cudaDeviceSynchronize());
  int conns = env ? atoi(env) : 8;
  int k = conns + 4;
  for (int round = 0; round < 2; round++) {
    if (round == 1) {
      // Create and destroy 3 streams first: does the assignment carry on from a global counter?
      for (int x = 0; x < 3; x++) { cudaStream_t t; CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking)); CK(cudaStreamDestroy(t)); }
    }
    std::vector<cudaStream_t> s(k);
    for (auto& x : s) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    printf("round %d: %d non-blocking streams created in a row\n", round, k);
    int collisions_first = 0;
    for (int i = 0; i < k; i++) {
      auto sh = row(s, i);
      printf("  stream %2d shares a queue with:", i);
      for (int j : sh) { printf(" %d", j); if (i < conns && j < conns) collisions_first++; }
      printf("\n");
    }
    printf("round %d: collisions among the first %d streams: %d\n", round, conns, collisions_first);
    if (round == 0) {
      // The legacy default stream and synchronous calls while one stream is blocked.
      int nullblocked = 0, memcpyblocked = 0, memsetblocked = 0, queryblocked = 0, freeblocked = 0;
      std::vector<char> buf(4096);
      void* d; CK(cudaMalloc(&d, 4096));
      for (int i = 0; i < k; i++) {
        block(s[i]);
        tick<<<1, 32, 0, 0>>>(counter);
        bool ok = done_within(0, 20);
        release(); CK(cudaDeviceSynchronize());
        if (!ok) { nullblocked++; printf("  legacy stream: kernel blocked behind stream %d\n", i); }
        if (!finishes_while_blocked(s[i], [&] { cudaMemcpy(d, buf.data(), 4096, cudaMemcpyHostToDevice); })) { memcpyblocked++; printf("  cudaMemcpy H2D blocked behind stream %d\n", i); }
        if (!finishes_while_blocked(s[i], [&] { cudaMemset(d, 0, 4096); })) { memsetblocked++; printf("  cudaMemset blocked behind stream %d\n", i); }
        int other = (i + 1) % k;
        if (!finishes_while_blocked(s[i], [&] { cudaStreamQuery(s[other]); })) { queryblocked++; printf("  cudaStreamQuery blocked behind stream %d\n", i); }
        void* f; CK(cudaMalloc(&f, 256));
        if (!finishes_while_blocked(s[i], [&] { cudaFree(f); })) { freeblocked++; printf("  cudaFree blocked behind stream %d\n", i); }
      }
      printf("legacy-stream kernel blocked behind %d of %d streams; sync memcpy %d, memset %d, query %d, free %d\n",
             nullblocked, k, memcpyblocked, memsetblocked, queryblocked, freeblocked);
      // A memcpy on a private stream created right after the others: its queue?
      cudaStream_t p; CK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));
      int pb = 0;
      for (int i = 0; i < k; i++) {
        block(s[i]);
        CK(cudaMemcpyAsync(d, buf.data(), 64, cudaMemcpyHostToDevice, p));
        bool ok = done_within(p, 20);
        release(); CK(cudaDeviceSynchronize());
        if (!ok) { pb++; printf("  extra stream %d blocked behind stream %d\n", k, i); }
      }
      CK(cudaStreamDestroy(p));
      CK(cudaFree(d));
    }
    for (auto& x : s) CK(cudaStreamDestroy(x));
  }
  printf("PROBE DONE\n");
  return 0;
}
