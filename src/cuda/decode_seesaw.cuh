// The seesaw consumer: warpgroup 1 computes the full scores and the online softmax of the even
// tiles, warpgroup 2 of the odd ones, so one's softmax runs while the other's wgmma keep the
// tensor cores busy; each accumulates P.V of every tile over its 256 output dims, the partner's
// tiles with the P it hands over. Every kernel runs it (docs/kernel.md).
#pragma once
#include "cuda/decode_consumer.cuh"

namespace smla::cuda {

// How many of the scores' k steps read Q from registers (spread over them: ConsumerCore), as
// many as each consumer's registers hold without spilling or serializing the wgmma (C7512). In
// the kQueryTma kernels, whose P.V of the partner's tile reads its P from shared memory (8
// registers fewer), bf16 stages 13 of 32 at 232 registers, fp8_ds_mla's converted stages 7 of
// 32 at 208, kF16 11 of 16 at 224 (sixty-eighth session, against 11 / 4 / 7: bf16 128 x 2 H=128
// -0.8%, fp8_ds_mla H=64 -1.1%, e4m3 H=64 -0.9%). Elsewhere bf16 10 (11 serialize), converted
// fp8 stages 4 (fp8_ds_mla at 208, an e4m3 cache with a bf16 query at 224), kF16 7; one step
// more spills or serializes (docs/kernel_measured.md).
// kCopiedRows: the rows my scores read landed by cp.async (bf16 stages, kF16's raw tiles), which
// no thread fenced for the wgmma's proxy; the fp8 layouts' producer fences the stages it writes.
template <bool kF16, bool kCopiedRows, bool kQueryTma>
constexpr int kSeesawQueryRegSteps = kQueryTma ? (kF16 ? 11 : !kCopiedRows ? 7 : 13)
                                               : (kF16 ? 7 : !kCopiedRows ? 4 : 10);

template <int kNumStages, bool kF16, bool kCopiedRows, bool kQueryTma>
struct SeesawConsumer
    : ConsumerCore<kNumStages, kF16, kSeesawQueryRegSteps<kF16, kCopiedRows, kQueryTma>> {
  using Core = ConsumerCore<kNumStages, kF16, kSeesawQueryRegSteps<kF16, kCopiedRows, kQueryTma>>;
  using Core::empty, Core::full, Core::half, Core::lane, Core::bias, Core::o, Core::pack,
      Core::row_max, Core::row_sum, Core::tid, Core::warp, Core::xch;
  static constexpr int kRawBuffers = RawTile<KvLayout::fp8_e4m3, true>::kBuffers;  // kF16
  // row_max[r] is the base of o and of row_sum, the sum of this warpgroup's own tiles' P.
  int held = -1;  // my last tile: its stage goes back once its P.V is done
  // kSmemP: the partner's P.V reads my P from shared memory (kQueryTma kernels: unsplit
  // plans, which spend the registers it frees on query steps), not from its registers (split
  // plans, small batches, where the fence and stores it takes cost 1.3-1.7% at 2 x 2 H=64).
  static constexpr bool kSmemP = kQueryTma;
  // The P handover, per writer h: [h] its P is in SeesawXch, [2 + h] the partner has read it
  // (kSmemP: its P.V of it is done).
  uint64_t* handover;
  uint64_t their_p;  // kSmemP: the partner's P in SeesawXch, the A operand of my P.V of its tile

  // In the block of barriers after the stages' (Smem::bars); before the CTA's first barrier.
  static __device__ __forceinline__ void init_barriers(uint64_t* bars) {
    for (int i = 0; i < 4; ++i) ptx::mbar_init(&bars[2 * kMaxStages + i], 128);
  }
  __device__ __forceinline__ void init(uint8_t* smem) {
    Core::init(smem);
    handover = reinterpret_cast<uint64_t*>(smem + Smem::bars) + 2 * kMaxStages;
    if constexpr (kSmemP) {
      const int partner = 1 - __shfl_sync(~0u, half, 0);  // warp-uniform: see Core::init
      their_p =
          ptx::plain_desc(ptx::smem_addr(p_area(partner)), SeesawXch::p_lbo, SeesawXch::p_sbo);
    }
  }
  // Warpgroup h's P in SeesawXch: as the wgmma's A operand (kSmemP), where this thread's P
  // word [k][i] lies at p_word(k, i); or thread by thread (p_slot: two uint4 a thread).
  __device__ __forceinline__ uint8_t* p_area(int h) const {
    return xch + SeesawXch::p + h * kMmaRows * kTileColumns * 2;
  }
  __device__ __forceinline__ int p_word(int k, int i) const {
    return (2 * warp + (i & 1)) * SeesawXch::p_sbo + (2 * k + i / 2) * SeesawXch::p_lbo +
           lane / 4 * 16 + lane % 4 * 4;
  }
  __device__ __forceinline__ uint4* p_slot(int h) const {
    return reinterpret_cast<uint4*>(xch + SeesawXch::p) + (h * 128 + tid) * 2;
  }

  // The CTA row (head - head0) of fragment row r.
  __device__ __forceinline__ int row_of(int r) const { return warp * 16 + lane / 4 + 8 * r; }

  __device__ __forceinline__ void release(int tile) { ptx::mbar_arrive(&empty[tile % kNumStages]); }
  __device__ __forceinline__ uint8_t* smem_base() const {
    return reinterpret_cast<uint8_t*>(full) - Smem::bars;
  }

  // Warpgroup 1's first step has no partner tile, the last step of the warpgroup whose turn
  // comes at n = tiles no tile of its own: separate instances, so that no wgmma is issued or
  // waited for under a condition while another is in flight (ptxas would serialize them all).
  __device__ __forceinline__ void run(int tiles, const DecodeParams& p) {
    // Broadcasts, as ConsumerCore::init's: a warp-uniform loop keeps its stage indices and the
    // wgmma descriptors in uniform registers.
    tiles = __shfl_sync(~0u, tiles, 0);
    if (tiles <= 0) return;
    if constexpr (kF16 && !kQueryTma)
      if (scores_on_landed<kF16, kQueryTma>(p)) return run_as<true>(tiles, p);
    run_as<false>(tiles, p);
  }
  // kLanded (scores_on_landed): my scores wait for the tile's records, my handover for its stage.
  template <bool kLanded>
  __device__ __forceinline__ void run_as(int tiles, const DecodeParams& p) {
    int n = __shfl_sync(~0u, half, 0);
    if (n == 0) step<kLanded, true, false>(n, p), n = 2;
    for (; n < tiles; n += 2) step<kLanded, true, true>(n, p);
    if (n == tiles) step<kLanded, false, true>(n, p);
  }

  // The partner's P of its tile n - 1 (!kSmemP: its A-operand words; kSmemP: it stays in
  // SeesawXch) and the bases it is relative to.
  __device__ __forceinline__ void take_partner_p(int n, uint32_t (&their_pa)[Core::kPSteps][4],
                                                 float (&theirs)[2]) {
    ptx::mbar_wait(&handover[1 - half], ((n - 1) / 2) & 1);  // its ((n - 1) / 2)-th tile
    if constexpr (!kSmemP) {
      const uint4* slot = p_slot(1 - half);
      const uint4 a = slot[0], b = slot[1];
      const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) their_pa[i / 4][i % 4] = words[i];
    }
    const float2 t = reinterpret_cast<const float2*>(xch + SeesawXch::base)[(1 - half) * 128 + tid];
    theirs[0] = t.x, theirs[1] = t.y;
    if constexpr (!kSmemP) ptx::mbar_arrive(&handover[2 + 1 - half]);
  }

  // My tile n's scores in log2 units, masked columns -inf (their rows are zeros); each row's max.
  template <bool kLanded>
  __device__ __forceinline__ void mask_scores(int n, float (&s)[kScores], float (&tile_max)[2],
                                              const DecodeParams& p) const {
    ptx::fence_operands(s);
    const float* b_col =
        bias + (kLanded ? n % kRawBuffers : n % kNumStages) * kTileColumns + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 b = *reinterpret_cast<const float2*>(b_col + 8 * j);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float& x = s[4 * j + i];
        x = fmaf(x, p.scale_log2, i & 1 ? b.y : b.x);
        tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(~0u, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(~0u, tile_max[r], 2));
    }
  }

  // My tile n's P at my base, added to my sums and handed to the partner through SeesawXch.
  template <bool kLanded>
  __device__ __forceinline__ void hand_over_p(int n, const float (&s)[kScores],
                                              uint32_t (&pa)[Core::kPSteps][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float base = row_max[r] == -INFINITY ? 0.f : row_max[r];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p0 = ptx::exp2_approx(s[4 * j + 2 * r] - base);
        const float p1 = ptx::exp2_approx(s[4 * j + 2 * r + 1] - base);
        row_sum[r] += p0 + p1;
        pa[j / 2][(j % 2) * 2 + r] = pack(p0, p1);
      }
    }
    if (n >= 2) ptx::mbar_wait(&handover[2 + half], (n / 2 - 1) & 1);  // my last P was read
    // The P.V of my tile (the partner's too, after this handover) reads its converted stage.
    if constexpr (kLanded) ptx::mbar_wait(&full[n % kNumStages], (n / kNumStages) & 1);
    if constexpr (kSmemP) {
      uint8_t* mine = p_area(half);
#pragma unroll
      for (int i = 0; i < Core::kPSteps * 4; ++i)
        *reinterpret_cast<uint32_t*>(mine + p_word(i / 4, i % 4)) = pa[i / 4][i % 4];
    } else {
      uint4* slot = p_slot(half);
      slot[0] = make_uint4(pa[0][0], pa[0][1], pa[0][2], pa[0][3]);
      slot[1] = make_uint4(pa[1][0], pa[1][1], pa[1][2], pa[1][3]);
    }
    reinterpret_cast<float2*>(xch + SeesawXch::base)[half * 128 + tid] =
        make_float2(row_max[0], row_max[1]);
    if constexpr (kSmemP) ptx::fence_proxy_async();  // P's st.shared, then the partner's wgmma
    ptx::mbar_arrive(&handover[half]);
  }

  // My scores' k steps issued before the partner's P is taken, the rest after it, so that its
  // handover wait and loads overlap the scores still queued: bf16 after 28 of 32 (128 x 2 H=128
  // 0.984, 2 x 2 0.983), the converted fp8 stages after 24 (fp8_ds_mla 2 x 2 0.988, 128 x 2
  // H=128 1.004); 16 or before any measured slower; kF16 takes it after all (its seventh query
  // register step spills otherwise). docs/kernel_measured.md.
  static constexpr int kSplitAt = kF16 ? Core::kScoreSteps : kCopiedRows ? 28 : 24;

  // My tile n's scores (own, two commit groups around taking the partner's P), the partner's
  // tile n - 1's P.V (partner), my P handed over while that runs, then my P.V: P.V in tile
  // order, and the partner gets my P before its next scores are done (docs/kernel.md). The
  // partner's P.V is queued behind my scores, before my softmax, so the tensor pipe runs it
  // while the softmax does; a base that my tile raises is applied to o after that P.V (o is in
  // flight until then). Every wait is unconditional: ptxas serializes every wgmma when o may be
  // in flight at a rescale.
  // Score fragment element 4j + 2r + e is row r, column 8j + 2 (lane % 4) + e; P's A-operand
  // word [k][i] is row i & 1.
  template <bool kLanded, bool own, bool partner>
  __device__ __forceinline__ void step(int n, const DecodeParams& p) {
    ptx::wgmma_wait<0>();
    ptx::fence_operands(o);
    if (held >= 0) release(held);
    held = -1;
    float s[kScores];
    const int buffer = n % (kF16 ? kRawBuffers : kNumStages);  // my scores' rows
    if constexpr (own) {
      if constexpr (kLanded)
        ptx::mbar_wait(&raw_full<KvLayout::fp8_e4m3>(smem_base())[n % kRawBuffers],
                       (n / kRawBuffers) & 1);
      else
        ptx::mbar_wait(&full[n % kNumStages], (n / kNumStages) & 1);
      if constexpr (kCopiedRows) ptx::fence_proxy_async();
      this->template issue_scores<0, kSplitAt>(s, buffer);
    }
    // The partner's base if above mine (so the two stay equal); o is not in flight.
    uint32_t their_pa[Core::kPSteps][4];
    float theirs[2] = {-INFINITY, -INFINITY};
    if constexpr (partner) take_partner_p(n, their_pa, theirs);
    if constexpr (own && kSplitAt < Core::kScoreSteps)
      this->template issue_scores<kSplitAt, Core::kScoreSteps>(s, buffer);
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float base = fmaxf(row_max[r], theirs[r]);
      alpha[r] = base == row_max[r] ? 1.f : ptx::exp2_approx(row_max[r] - base);
      row_max[r] = base;
      row_sum[r] *= alpha[r];
    }
    this->rescale_o(alpha);
    if constexpr (partner) {
      // The stage's rows are visible to this wgmma: the partner waited for them and fenced
      // the proxies before its handover, which this thread waited for (release and acquire
      // chain; the fence is cumulative). Waiting for `full` again here held 6% of the warp
      // samples (bf16 128 x 2 H=128).
      // P as handed over: its base is the one just adopted, as the partner took mine (my last
      // P's) before its softmax and mine has not moved since, so it is never below mine.
      if constexpr (kSmemP)
        this->issue_pv(their_p, (n - 1) % kNumStages);
      else
        this->issue_pv(their_pa, (n - 1) % kNumStages);
    } else {
      ptx::wgmma_commit();  // an empty group, so that wait<1> below waits for the scores
    }
    ptx::wgmma_wait<1>();
    if constexpr (kF16 && own && !kLanded)  // the tile's raw buffer is free for the producer
      ptx::mbar_arrive(&raw_bars<KvLayout::fp8_e4m3>(smem_base())[n % kRawBuffers]);
    // My tile's max past the threshold (also the first attended tile) raises my base; o moves
    // to it once the partner's P.V is done.
    float raise[2] = {1.f, 1.f};
    uint32_t pa[Core::kPSteps][4];
    if constexpr (own) {
      float tile_max[2] = {-INFINITY, -INFINITY};
      mask_scores<kLanded>(n, s, tile_max, p);
      if constexpr (kLanded)  // the tile's raw buffer and its biases are free for the producer
        ptx::mbar_arrive(&raw_bars<KvLayout::fp8_e4m3>(smem_base())[n % kRawBuffers]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (tile_max[r] > row_max[r] + kRescaleThreshold<kF16>) {
          const float base = tile_max[r] + kBaseLift<kF16>;
          raise[r] = ptx::exp2_approx(row_max[r] - base);  // -inf: 0
          row_sum[r] *= raise[r];
          row_max[r] = base;
        }
      }
      hand_over_p<kLanded>(n, s, pa);
    }
    if constexpr (partner) {
      ptx::wgmma_wait<0>();  // the partner's stage (kSmemP: and P) go back at once
      ptx::fence_operands(o);
      release(n - 1);
      if constexpr (kSmemP) ptx::mbar_arrive(&handover[2 + 1 - half]);
    }
    if constexpr (own) {
      this->rescale_o(raise);
      this->issue_pv(pa, n % kNumStages);
      held = n;
    }
  }

  // After the last tile: each row's sum over its quad, then the two warpgroups' (base, sum)
  // combined into one base, to which o moves.
  __device__ __forceinline__ void finish_rows() {
    ptx::wgmma_wait<0>();
    ptx::fence_operands(o);
    if (held >= 0) release(held);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] += __shfl_xor_sync(~0u, row_sum[r], 1);
      row_sum[r] += __shfl_xor_sync(~0u, row_sum[r], 2);
    }
    float4* ml = reinterpret_cast<float4*>(xch + SeesawXch::finish);
    ml[half * 128 + tid] = make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]);
    ptx::named_sync(kFinishBarrier, 256);
    const float4 t = ml[(1 - half) * 128 + tid];
    const float their_max[2] = {t.x, t.y}, their_sum[2] = {t.z, t.w};
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m = fmaxf(row_max[r], their_max[r]);
      alpha[r] = row_max[r] == m ? 1.f : exp2f(row_max[r] - m);
      const float beta = their_max[r] == m ? 1.f : exp2f(their_max[r] - m);
      // Rounded products (no fma), so both warpgroups compute the same sum bit for bit.
      row_sum[r] = __fmul_rn(row_sum[r], alpha[r]) + __fmul_rn(their_sum[r], beta);
      row_max[r] = m;
    }
    this->rescale_o(alpha);
  }
};

}  // namespace smla::cuda
