// Thin wrappers over the sm_90a instructions the kernels use: byte permutes and e4m3
// conversions, mbarriers, cp.async, proxy fences, named and cluster barriers, distributed shared
// memory, register reallocation and wgmma.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace smla::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// prmt.b32 with the whole selector: a nibble's bit 3 fills its byte with the selected byte's
// sign bit (__byte_perm reads only bits 0-2 of each nibble).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// Four e4m3 (one word) -> two f16x2 (bytes 0-1, bytes 2-3), exact. Splitting the word in PTX
// lets the second conversion read the upper half in place (no shift first).
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(uint32_t w) {
  uint2 h;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}"
      : "=r"(h.x), "=r"(h.y)
      : "r"(w));
  return h;
}

// ---- mbarrier -------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Expects `bytes` more of the current phase's asynchronous copies, and arrives.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// ---- L2 eviction policies ------------------------------------------------------------------
// For a load's .L2::cache_hint: its lines are the first L2 evicts (data read once), or their
// priority stays as it was.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
  uint64_t first, unchanged;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
  asm("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(unchanged));
  return evict_first ? first : unchanged;
}

// ---- tensor memory access -------------------------------------------------------------------
// The box of `map` at coordinates (x, y[, z]) into shared memory at `dst`, swizzled as the map
// says (by dst's address bits), completing its bytes on `bar`'s transaction count.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}
// The 3-d box, its lines given L2 eviction `policy` (l2_policy).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int x, int y,
                                            int z, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// ---- cp.async -------------------------------------------------------------------------------
// 16 bytes global -> shared; zero-filled (no global read) when !valid.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// The same, kEvictFirst: the line is the first L2 evicts (a row read once).
template <bool kEvictFirst>
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  if constexpr (kEvictFirst) {
    const uint64_t policy = l2_policy(true);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst),
                 "l"(src), "r"(valid ? 16 : 0), "l"(policy)
                 : "memory");
  } else {
    cp_async_16(dst, src, valid);
  }
}
// 8 bytes global -> shared (through L1: .cg takes only 16); zero-filled when !valid.
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 8 : 0)
               : "memory");
}
// Arrives on `bar` once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// Makes generic-proxy shared writes (st.shared, cp.async) visible to wgmma (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// 2^x in one MUFU op (relative error ~2^-22; -inf -> +0): P is rounded to bf16 anyway.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Fetches `bytes` (a multiple of 16, 16-byte aligned) at `src` into L2: a hint with nothing to
// wait for.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// ---- programmatic dependent launch ----------------------------------------------------------
// Lets the next kernel on the stream launch now (it still waits for this grid in griddep_wait).
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the previous kernel on the stream has finished and its writes are visible; a
// no-op for a kernel launched without programmatic stream serialization.
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// ---- barriers and registers -----------------------------------------------------------------
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting: its shared-memory writes so far are visible to
// the threads that wait there (bar.sync) once `threads` have arrived.
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- clusters -------------------------------------------------------------------------------
// Every non-exited thread of the cluster arrives, then waits: shared-memory writes before the
// arrive are visible to every CTA of the cluster after the wait. Whole warps only.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// As cluster_sync, but the arrive orders no memory (the wait still acquires): enough where the
// barrier only keeps each CTA's shared memory alive until the others' reads of it are done,
// which holds when every such read's value is used before the arrive.
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile(
      "barrier.cluster.arrive.relaxed.aligned;\n"
      "barrier.cluster.wait.aligned;" ::: "memory");
}
// `p` (into this CTA's shared memory) in the shared memory of cluster CTA `rank`: plain loads
// through the result read the other CTA's.
template <class T>
__device__ __forceinline__ T* cluster_map(T* p, int rank) {
  uint64_t out;
  asm("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(p), "r"(rank));
  return reinterpret_cast<T*>(out);
}

template <int N>
__device__ __forceinline__ void reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// ---- wgmma ----------------------------------------------------------------------------------
// Shared-memory matrix descriptor. Offsets in bytes. Unswizzled (plain_desc): core matrices of
// 8 rows x 16 B stored as 128 contiguous bytes, `lbo` apart along K and `sbo` along M or N. With
// the 128-byte swizzle (sw128_desc) the swizzle atom (8 rows x 128 B) must be 1024-byte aligned.
__device__ __forceinline__ uint64_t plain_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32;
}
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return plain_desc(addr, lbo, sbo) | static_cast<uint64_t>(1) << 62;
}
// What to add to a descriptor to move its start address by `bytes` (a multiple of 16).
__host__ __device__ constexpr uint64_t desc_offset(uint32_t bytes) { return bytes >> 4; }

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// x, opaque to the compiler: what depends on it is not computed before this point (hoisted
// into a loop's register pressure).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Pins accumulator registers in program order around asynchronous wgmma (no code emitted).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define SMLA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define SMLA_F16(i) SMLA_F4(i), SMLA_F4(i + 4), SMLA_F4(i + 8), SMLA_F4(i + 12)
#define SMLA_F64(i) SMLA_F16(i), SMLA_F16(i + 16), SMLA_F16(i + 32), SMLA_F16(i + 48)
// An m64n256 wgmma's 128 accumulator operands, %0..%127.
#define SMLA_D128                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "          \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "          \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "          \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "          \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "          \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "    \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "      \
  "%125, %126, %127}, "

// The operand type of a wgmma: bf16, or f16 (kF16); accumulators are f32.
#define SMLA_WGMMA_TYPE(kF16, STMT) \
  if constexpr (kF16) {             \
    STMT("f16");                    \
  } else {                          \
    STMT("bf16");                   \
  }

// D[64x32] (+)= A[64x16] * B[32x16]^T in bf16, A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t a, uint64_t b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : SMLA_F16(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// The same with A in registers (two elements per word, the P.V A operand's layout).
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4],
                                                   uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : SMLA_F16(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// D[64x32] (+)= A[64x32] * B[32x32]^T in e4m3, A and B K-major in shared memory (fp8 wgmma
// take no other major-ness).
__device__ __forceinline__ void wgmma_m64n32k32_ss_e4m3(float (&d)[16], uint64_t a, uint64_t b,
                                                        bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1;\n}\n"
      : SMLA_F16(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// The same with A in registers (four elements per word).
__device__ __forceinline__ void wgmma_m64n32k32_rs_e4m3(float (&d)[16], const uint32_t (&a)[4],
                                                        uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : SMLA_F16(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// D[64x256] += A[64x16] * B[16x256], A in registers (two elements per word), B N-major in
// shared memory.
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t b) {
#define SMLA_STMT(T)                                                                         \
  asm volatile(                                                                              \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                            \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " "                             \
      SMLA_D128                                                                              \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                     \
      : SMLA_F64(0), SMLA_F64(64)                                                            \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
  SMLA_WGMMA_TYPE(kF16, SMLA_STMT)
#undef SMLA_STMT
}

// The same with A K-major in shared memory.
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t a, uint64_t b) {
#define SMLA_STMT(T)                                                                         \
  asm volatile(                                                                              \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                            \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " "                             \
      SMLA_D128                                                                              \
      "%128, %129, p, 1, 1, 0, 1;\n}\n"                                                      \
      : SMLA_F64(0), SMLA_F64(64)                                                            \
      : "l"(a), "l"(b))
  SMLA_WGMMA_TYPE(kF16, SMLA_STMT)
#undef SMLA_STMT
}

#undef SMLA_F4
#undef SMLA_F16
#undef SMLA_F64
#undef SMLA_D128
#undef SMLA_WGMMA_TYPE

}  // namespace smla::cuda::ptx
