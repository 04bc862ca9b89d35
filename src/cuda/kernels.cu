// Chorus's device kernel (see devjob.h): one instantiation per NCCL type, compiled by nvcc into a
// fatbin that the library embeds (kernels_blob.c) and loads with cuModuleLoadData at run time; the
// library itself never links CUDA. Arithmetic follows the host kernels (reduce/reduce.h): 8-, 16- and
// 32-bit floats combine in fp32 and round once, integers wrap, max/min of floats follow fmax/fmin,
// integer SumPostDiv truncates toward zero.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "devjob.h"

namespace {

enum { SUM = 0, PROD = 1, MAX = 2, MIN = 3, PREMULSUM = 4, SUMPOSTDIV = 5 };

// Storage type T, compute type A, and the conversions between them.
template <int TYPE> struct ty;
#define INT_TYPE(N, T, U)                                       \
  template <> struct ty<N> {                                    \
    typedef T store;                                            \
    typedef U acc; /* unsigned: sums and products wrap */       \
    static __device__ U load(T v) { return (U)v; }              \
    static __device__ T save(U v) { return (T)v; }              \
    static constexpr bool is_int = true, is_signed = (T)-1 < 0; \
  };
INT_TYPE(0, int8_t, uint8_t)
INT_TYPE(1, uint8_t, uint8_t)
INT_TYPE(2, int32_t, uint32_t)
INT_TYPE(3, uint32_t, uint32_t)
INT_TYPE(4, int64_t, uint64_t)
INT_TYPE(5, uint64_t, uint64_t)
#define FLOAT_TYPE(N, T, A, LOAD, SAVE)               \
  template <> struct ty<N> {                          \
    typedef T store;                                  \
    typedef A acc;                                    \
    static __device__ A load(T v) { return LOAD; }    \
    static __device__ T save(A v) { return SAVE; }    \
    static constexpr bool is_int = false;             \
  };
FLOAT_TYPE(6, __half, float, __half2float(v), __float2half_rn(v))
FLOAT_TYPE(7, float, float, v, v)
FLOAT_TYPE(8, double, double, v, v)
FLOAT_TYPE(9, __nv_bfloat16, float, __bfloat162float(v), __float2bfloat16_rn(v))
// e4m3 saturates to +-448 (NCCL's satfinite); e5m2 overflows to Inf.
FLOAT_TYPE(10, __nv_fp8_storage_t, float, __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3))),
           __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3))
FLOAT_TYPE(11, __nv_fp8_storage_t, float, __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E5M2))),
           __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2))

template <int TYPE> struct ops {
  typedef typename ty<TYPE>::acc A;
  typedef typename ty<TYPE>::store T;
  // Max and min compare signed integers as signed.
  static __device__ bool less(A a, A b) {
    if constexpr (ty<TYPE>::is_int) {
      if constexpr (ty<TYPE>::is_signed) return (T)a < (T)b;
    }
    return a < b;
  }
  static __device__ A combine(int op, A a, A b) {
    switch (op) {
      case PROD: return a * b;
      case MAX:
        if constexpr (!ty<TYPE>::is_int) return fmax(a, b);
        else return less(a, b) ? b : a;
      case MIN:
        if constexpr (!ty<TYPE>::is_int) return fmin(a, b);
        else return less(b, a) ? b : a;
      default: return a + b;
    }
  }
  static __device__ A premul(const dev_args& g, uint64_t scalar, A v) {
    if (g.op_kind != PREMULSUM) return v;
    if constexpr (ty<TYPE>::is_int) return v * (A)scalar;
    else return v * (A)__longlong_as_double((long long)scalar);
  }
  static __device__ A postop(const dev_args& g, A v) {
    if (g.op_kind != SUMPOSTDIV || g.divisor <= 1) return v;
    if constexpr (!ty<TYPE>::is_int) {
      return v / (A)g.divisor;
    } else if constexpr (!ty<TYPE>::is_signed) {
      return (A)((uint64_t)v / g.divisor);
    } else { // truncate toward zero: divide the magnitude, unsigned (no overflow at the type's minimum)
      int64_t s = (int64_t)(T)v;
      uint64_t m = s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
      uint64_t q = m / g.divisor;
      return (A)(s < 0 ? 0 - q : q);
    }
  }
};

// Reduce nv vectors of 16 bytes (V elements) from nsrc sources into ndst destinations: each thread U
// vectors a step, the U loads of each source issued before any is used, so that U x nsrc loads are
// in flight per thread (one at a time left HBM idle: the 128 MiB AllReduce ran at 1.4x its bound).
template <int TYPE, int U>
__device__ void reduce_vec(const dev_args& g, const typename ty<TYPE>::store* const* src, const uint64_t* scalar,
                           typename ty<TYPE>::store* const* dst, int nsrc, int ndst, uint64_t first, uint64_t stride,
                           uint64_t nv) {
  typedef typename ty<TYPE>::store T;
  typedef typename ty<TYPE>::acc A;
  constexpr int V = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
  uint64_t i = first;
  for (; i + (U - 1) * stride < nv; i += U * stride) {
    uint4 raw[U];
    A acc[U][V];
#pragma unroll
    for (int u = 0; u < U; u++) raw[u] = ((const uint4*)src[0])[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int v = 0; v < V; v++) acc[u][v] = ops<TYPE>::premul(g, scalar[0], ty<TYPE>::load(((const T*)&raw[u])[v]));
    for (int k = 1; k < nsrc; k++) {
#pragma unroll
      for (int u = 0; u < U; u++) raw[u] = ((const uint4*)src[k])[i + u * stride];
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int v = 0; v < V; v++)
          acc[u][v] = ops<TYPE>::combine(g.op_kind, acc[u][v],
                                         ops<TYPE>::premul(g, scalar[k], ty<TYPE>::load(((const T*)&raw[u])[v])));
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      uint4 out;
#pragma unroll
      for (int v = 0; v < V; v++) ((T*)&out)[v] = ty<TYPE>::save(ops<TYPE>::postop(g, acc[u][v]));
      for (int d = 0; d < ndst; d++) ((uint4*)dst[d])[i + u * stride] = out;
    }
  }
  for (; i < nv; i += stride) {
    uint4 raw = ((const uint4*)src[0])[i];
    A acc[V];
#pragma unroll
    for (int v = 0; v < V; v++) acc[v] = ops<TYPE>::premul(g, scalar[0], ty<TYPE>::load(((const T*)&raw)[v]));
    for (int k = 1; k < nsrc; k++) {
      raw = ((const uint4*)src[k])[i];
#pragma unroll
      for (int v = 0; v < V; v++)
        acc[v] = ops<TYPE>::combine(g.op_kind, acc[v], ops<TYPE>::premul(g, scalar[k], ty<TYPE>::load(((const T*)&raw)[v])));
    }
    uint4 out;
#pragma unroll
    for (int v = 0; v < V; v++) ((T*)&out)[v] = ty<TYPE>::save(ops<TYPE>::postop(g, acc[v]));
    for (int d = 0; d < ndst; d++) ((uint4*)dst[d])[i] = out;
  }
}

template <int TYPE> __device__ void run(const dev_args& g) {
  typedef typename ty<TYPE>::store T;
  typedef typename ty<TYPE>::acc A;
  __shared__ const T* src[DEV_MAX_RANKS];
  __shared__ uint64_t scalar[DEV_MAX_RANKS];
  __shared__ T* dst[DEV_MAX_RANKS];
  __shared__ uint64_t sp[DEV_MAX_RANKS], dp[DEV_MAX_RANKS], ss[DEV_MAX_RANKS];
  __shared__ int nsrc, ndst, live, failed[2];
  const dev_job& j = g.job[blockIdx.y];
  const dev_table* tab = (const dev_table*)g.table;
  // The table: in host memory (one read per thread, all at once: one round trip, not 2n), or, for a
  // grid of many blocks, the stage kernel's copy in device memory (gpu/call.c).
  unsigned t = threadIdx.x;
  if (t < DEV_MAX_RANKS) {
    bool on = j.src_mask >> t & 1;
    sp[t] = on ? tab->buf[j.src_buf][t] : 0;
    ss[t] = on ? tab->scalar[t] : 0;
  } else if (t < 2 * DEV_MAX_RANKS) {
    unsigned r = t - DEV_MAX_RANKS;
    dp[r] = j.dst_mask >> r & 1 ? tab->buf[j.dst_buf][r] : 0;
  } else if (t == 2 * DEV_MAX_RANKS) {
    live = tab->seq == g.seq; // the table is this call's (not a failed or aborted one's)
  } else if (t == 2 * DEV_MAX_RANKS + 1 || t == 2 * DEV_MAX_RANKS + 2) {
    // a failed communicator: a peer's stream may have been let through its barrier
    unsigned k = t - 2 * DEV_MAX_RANKS - 1;
    failed[k] = g.fail[k] ? *(volatile const int*)g.fail[k] : 0;
  }
  __syncthreads();
  if (t == 0 && j.reduce == DEV_PAIR) { // ranks a < b, blocks of j.src_off bytes (devjob.h)
    uint64_t a = __ffs(j.src_mask) - 1, b = 31 - __clz(j.src_mask), c = j.src_off;
    src[0] = (const T*)(sp[a] + b * c), src[1] = (const T*)(sp[b] + a * c);
    dst[0] = (T*)(dp[b] + a * c), dst[1] = (T*)(dp[a] + b * c);
    nsrc = ndst = 2;
  } else if (t == 0) {
    nsrc = ndst = 0;
    for (int r = 0; r < DEV_MAX_RANKS; r++) {
      if (j.src_mask >> r & 1) scalar[nsrc] = ss[r], src[nsrc++] = (const T*)(sp[r] + j.src_off);
      if (j.dst_mask >> r & 1) dst[ndst++] = (T*)(dp[r] + j.dst_off);
    }
  }
  __syncthreads();
  if (!live || failed[0] || failed[1]) return; // addresses of another call are never used
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  constexpr int U = 4; // elements in flight per thread: loads of all of them before any use
  if (j.reduce == DEV_PAIR) { // both reads of an element before either write: in place is safe
    uint64_t bytes = j.count * sizeof(T);
    if ((((uintptr_t)src[0] | (uintptr_t)src[1] | (uintptr_t)dst[0] | (uintptr_t)dst[1] | bytes) & 15) == 0) {
      const uint4 *s0 = (const uint4*)src[0], *s1 = (const uint4*)src[1];
      for (uint64_t i = first; i < bytes / 16; i += stride) {
        uint4 v0 = s0[i], v1 = s1[i];
        ((uint4*)dst[0])[i] = v0, ((uint4*)dst[1])[i] = v1;
      }
      return;
    }
    for (uint64_t i = first; i < j.count; i += stride) {
      T v0 = src[0][i], v1 = src[1][i];
      dst[0][i] = v0, dst[1][i] = v1;
    }
    return;
  }
  if (j.reduce == DEV_COPY) {
    // A copy: 16 bytes at a time when every pointer and the length allow it.
    uint64_t bytes = j.count * sizeof(T);
    uintptr_t any = (uintptr_t)src[0] | bytes;
    for (int d = 0; d < ndst; d++) any |= (uintptr_t)dst[d];
    if ((any & 15) == 0) {
      const uint4* s = (const uint4*)src[0];
      uint64_t n16 = bytes / 16, i = first;
      for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = s[i + u * stride];
        for (int d = 0; d < ndst; d++)
#pragma unroll
          for (int u = 0; u < U; u++) ((uint4*)dst[d])[i + u * stride] = v[u];
      }
      for (; i < n16; i += stride) {
        uint4 v = s[i];
        for (int d = 0; d < ndst; d++) ((uint4*)dst[d])[i] = v;
      }
      return;
    }
    for (uint64_t i = first; i < j.count; i += stride) {
      T v = src[0][i];
      for (int d = 0; d < ndst; d++) dst[d][i] = v;
    }
    return;
  }
  // Reductions: 16 bytes of every source per thread when the pointers allow it (2-byte and 1-byte
  // types need it to approach copy bandwidth), the elements past the last full 16 bytes after.
  uintptr_t align = 0;
  for (int k = 0; k < nsrc; k++) align |= (uintptr_t)src[k];
  for (int d = 0; d < ndst; d++) align |= (uintptr_t)dst[d];
  if ((align & 15) == 0) {
    constexpr int V = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
    uint64_t nv = j.count / V;
    if (g.unroll > 1) reduce_vec<TYPE, (V >= 8 ? 2 : 4)>(g, src, scalar, dst, nsrc, ndst, first, stride, nv);
    else reduce_vec<TYPE, 1>(g, src, scalar, dst, nsrc, ndst, first, stride, nv);
    first += nv * V; // the tail, below
  }
  uint64_t i = first;
  for (; i + (U - 1) * stride < j.count; i += U * stride) {
    A acc[U];
#pragma unroll
    for (int u = 0; u < U; u++) acc[u] = ops<TYPE>::premul(g, scalar[0], ty<TYPE>::load(src[0][i + u * stride]));
    for (int k = 1; k < nsrc; k++) {
      T v[U];
#pragma unroll
      for (int u = 0; u < U; u++) v[u] = src[k][i + u * stride];
#pragma unroll
      for (int u = 0; u < U; u++)
        acc[u] = ops<TYPE>::combine(g.op_kind, acc[u], ops<TYPE>::premul(g, scalar[k], ty<TYPE>::load(v[u])));
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      T v = ty<TYPE>::save(ops<TYPE>::postop(g, acc[u]));
      for (int d = 0; d < ndst; d++) dst[d][i + u * stride] = v;
    }
  }
  for (; i < j.count; i += stride) {
    A acc = ops<TYPE>::premul(g, scalar[0], ty<TYPE>::load(src[0][i]));
    for (int k = 1; k < nsrc; k++)
      acc = ops<TYPE>::combine(g.op_kind, acc, ops<TYPE>::premul(g, scalar[k], ty<TYPE>::load(src[k][i])));
    T v = ty<TYPE>::save(ops<TYPE>::postop(g, acc));
    for (int d = 0; d < ndst; d++) dst[d][i] = v;
  }
}

} // namespace

// One block: every word of the table and both failure words read at once (one round trip), then
// written to device memory for the call's kernel, which runs next on the same stream.
extern "C" __global__ void __launch_bounds__(512) chorus_stage(const dev_stage_args a) {
  constexpr unsigned W = sizeof(dev_table) / sizeof(uint64_t);
  static_assert(sizeof(dev_table) % sizeof(uint64_t) == 0, "the table is copied in 8-byte words");
  static_assert(W + 2 <= 512, "one thread per word");
  dev_staged* d = (dev_staged*)a.dst;
  unsigned t = threadIdx.x;
  if (t < W) {
    ((uint64_t*)&d->table)[t] = ((volatile const uint64_t*)a.table)[t];
  } else if (t < W + 2) {
    unsigned k = t - W;
    d->failed[k] = a.fail[k] ? *(volatile const uint32_t*)a.fail[k] : 0;
  }
}

#define KERNEL(N) \
  extern "C" __global__ void __launch_bounds__(512) chorus_dev_##N(const dev_args g) { run<N>(g); }
KERNEL(0)
KERNEL(1)
KERNEL(2)
KERNEL(3)
KERNEL(4)
KERNEL(5)
KERNEL(6)
KERNEL(7)
KERNEL(8)
KERNEL(9)
KERNEL(10)
KERNEL(11)
