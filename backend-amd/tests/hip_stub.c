/* A stand-in for libamdhip64 with the entry points trident uses: host memory for device memory,
   every call appended to the file named by STUB_HIP_LOG (launches with their grid, block and
   argument buffer in hex), and the call named by STUB_HIP_FAIL failing with error 2. Built by
   tests/hip_stub.rs; never shipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails(const char *name) {
  const char *f = getenv("STUB_HIP_FAIL");
  return f && strcmp(f, name) == 0;
}

static void logf_(const char *line) {
  const char *p = getenv("STUB_HIP_LOG");
  if (!p) return;
  FILE *f = fopen(p, "a");
  if (!f) return;
  fprintf(f, "%s\n", line);
  fclose(f);
}

#define CALL(name)        \
  do {                    \
    logf_(#name);         \
    if (fails(#name)) return 2; \
  } while (0)

int hipInit(unsigned flags) { (void)flags; CALL(hipInit); return 0; }
int hipGetDeviceCount(int *n) { CALL(hipGetDeviceCount); *n = 1; return 0; }
int hipSetDevice(int d) { (void)d; CALL(hipSetDevice); return 0; }
int hipMalloc(void **p, size_t n) { CALL(hipMalloc); *p = aligned_alloc(256, (n + 255) / 256 * 256); return *p ? 0 : 2; }
int hipFree(void *p) { CALL(hipFree); free(p); return 0; }
int hipMemcpy(void *d, const void *s, size_t n, int kind) { (void)kind; CALL(hipMemcpy); memcpy(d, s, n); return 0; }
int hipModuleLoadData(void **m, const void *image) {
  CALL(hipModuleLoadData);
  /* A code object is an ELF file. */
  if (memcmp(image, "\x7f" "ELF", 4) != 0) return 3;
  *m = (void *)0x1000;
  return 0;
}
int hipModuleGetFunction(void **f, void *m, const char *name) {
  char line[512];
  snprintf(line, sizeof line, "hipModuleGetFunction %s", name);
  logf_(line);
  (void)m;
  if (fails("hipModuleGetFunction")) return 2;
  *f = (void *)0x2000;
  return 0;
}
int hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, void *stream, void **params, void **extra) {
  (void)f; (void)shared; (void)params;
  if (fails("hipModuleLaunchKernel")) { logf_("hipModuleLaunchKernel"); return 2; }
  /* extra = { 1, buffer, 2, &size, 3 } */
  if (!extra || (size_t)extra[0] != 1 || (size_t)extra[2] != 2 || (size_t)extra[4] != 3) return 4;
  unsigned char *buf = extra[1];
  size_t size = *(size_t *)extra[3];
  char *line = malloc(128 + 2 * size);
  int n = sprintf(line, "hipModuleLaunchKernel grid %u %u %u block %u %u %u stream %s args ", gx, gy, gz, bx, by, bz,
                  stream ? "own" : "null");
  for (size_t i = 0; i < size; i++) n += sprintf(line + n, "%02x", buf[i]);
  logf_(line);
  free(line);
  return 0;
}
int hipDeviceSynchronize(void) { CALL(hipDeviceSynchronize); return 0; }
const char *hipGetErrorString(int e) { return e == 2 ? "stub: fails on demand" : "stub error"; }

/* Streams, events, stream memory operations and IPC handles. A stub stream runs its work at
   once, except that a stream wait not yet satisfied leaves the stream "busy" (hipStreamQuery
   answers hipErrorNotReady) until the awaited word satisfies it. */
typedef struct {
  unsigned long long *wait_ptr;
  unsigned long long wait_value;
  unsigned wait_flags;
} stub_stream;

static int satisfied(const stub_stream *s) {
  if (!s->wait_ptr) return 1;
  unsigned long long seen = *(volatile unsigned long long *)s->wait_ptr;
  return s->wait_flags == 1 ? seen == s->wait_value : seen >= s->wait_value;
}

int hipStreamCreateWithFlags(void **s, unsigned flags) {
  char line[64];
  snprintf(line, sizeof line, "hipStreamCreateWithFlags flags %u", flags);
  logf_(line);
  if (fails("hipStreamCreateWithFlags")) return 2;
  *s = calloc(1, sizeof(stub_stream));
  return 0;
}
int hipStreamDestroy(void *s) { CALL(hipStreamDestroy); free(s); return 0; }
int hipStreamSynchronize(void *s) { (void)s; CALL(hipStreamSynchronize); return 0; }
int hipStreamQuery(void *p) {
  stub_stream *s = p;
  if (fails("hipStreamQuery")) return 2;
  if (!s || satisfied(s)) {
    if (s) s->wait_ptr = 0;
    return 0;
  }
  return 600;
}
int hipMemcpyAsync(void *d, const void *s, size_t n, int kind, void *stream) {
  char line[64];
  (void)stream;
  snprintf(line, sizeof line, "hipMemcpyAsync %zu kind %d", n, kind);
  logf_(line);
  if (fails("hipMemcpyAsync")) return 2;
  memcpy(d, s, n);
  return 0;
}
int hipDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  CALL(hipDeviceGetAttribute);
  if (attr != 63) return 1; /* only hipDeviceAttributeMultiprocessorCount is known here */
  *v = 304;
  return 0;
}
int hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *f, int block, size_t lds) {
  (void)f; (void)lds;
  CALL(hipModuleOccupancyMaxActiveBlocksPerMultiprocessor);
  *n = block <= 256 ? 2 : 1;
  return 0;
}
int hipDeviceEnablePeerAccess(int peer, unsigned flags) { (void)peer; (void)flags; CALL(hipDeviceEnablePeerAccess); return 0; }
int hipEventCreate(void **e) { CALL(hipEventCreate); *e = malloc(8); return 0; }
int hipEventDestroy(void *e) { CALL(hipEventDestroy); free(e); return 0; }
int hipEventRecord(void *e, void *s) { (void)e; (void)s; CALL(hipEventRecord); return 0; }
int hipEventSynchronize(void *e) { (void)e; CALL(hipEventSynchronize); return 0; }
int hipEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; CALL(hipEventElapsedTime); *ms = 1.5f; return 0; }
int hipStreamWriteValue64(void *s, void *ptr, unsigned long long v, unsigned flags) {
  char line[128];
  (void)s;
  snprintf(line, sizeof line, "hipStreamWriteValue64 %llu flags %u", v, flags);
  logf_(line);
  if (fails("hipStreamWriteValue64")) return 2;
  *(unsigned long long *)ptr = v; /* the stub's stream runs at once */
  return 0;
}
int hipStreamWaitValue64(void *p, void *ptr, unsigned long long v, unsigned flags, unsigned long long mask) {
  char line[160];
  stub_stream *s = p;
  snprintf(line, sizeof line, "hipStreamWaitValue64 %llu flags %u mask %llx seen %llu", v, flags, mask,
           *(unsigned long long *)ptr);
  logf_(line);
  if (fails("hipStreamWaitValue64")) return 2;
  if (s) {
    s->wait_ptr = ptr;
    s->wait_value = v;
    s->wait_flags = flags;
  }
  return 0;
}
int hipIpcGetMemHandle(void *handle, void *ptr) {
  CALL(hipIpcGetMemHandle);
  memset(handle, 0, 64);
  memcpy(handle, &ptr, sizeof ptr); /* the stub's handle is the address */
  return 0;
}
typedef struct { unsigned char reserved[64]; } hipIpcMemHandle_t;
int hipIpcOpenMemHandle(void **ptr, hipIpcMemHandle_t handle, unsigned flags) {
  (void)flags;
  CALL(hipIpcOpenMemHandle);
  memcpy(ptr, handle.reserved, sizeof *ptr);
  return 0;
}
