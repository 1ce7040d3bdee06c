// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-kernel.cuh: the Hopper GEMM kernel (cuda-wgmma-tiles.cuh gives its layout and
// pipeline). A CTA's work is written as the methods of wgmma_cta, one per role: the barriers'
// setup, the producer, the SPLIT epilogue warps and the consumers (their main loop, the terms of
// the epilogue, and the hand-over of SPLIT tiles). The kernel instances are compiled in
// cuda-wgmma-kernels-*.cu, each with its entry in the launch table (WGMMA_KERNEL).
#pragma once

#include "cuda-wgmma-epilogue.cuh"
#include "cuda-wgmma-producer.cuh"

namespace {

#ifdef BIE_WGMMA_DEVICE

template <bool BINARY, int BN, typename T, bool FAST, bool TAPS> struct wgmma_cta {
    static constexpr int NCW = cw_for(BN), BM = bm_for(BINARY, BN); // consumer warpgroups, rows per tile
    static constexpr bool PP = pp_for(BINARY, BN);
    static constexpr bool SPLIT = split_for(BINARY, BN);
    static constexpr int STAGES = stages_for(BINARY, BN);
    static constexpr int STAGE_BYTES = (BM + BN) * BK;
    static constexpr int ACC = BN / 2; // accumulators per thread
    // Column terms per lane (TAPS: ep.colcls).
    static constexpr int NCP = BINARY && FAST && !SPLIT && !TAPS ? BN / 32 : 1;
    static_assert(!SPLIT || (FAST && !std::is_same<T, bits_t>::value), "SPLIT tiles store float y by bulk copies");

    const CUtensorMap &ta, &tb, &ty;
    const int & y_mode;
    const int64_t &M, &N;
    const int & ktiles;
    const gemm_epilogue & ep;
    const gemm_gather & gs;

    uint32_t base, bars; // the stage ring: full[STAGES], empty[STAGES], dump full, dump empty
    uint8_t * area;      // then (1 KB on, so 1024-byte aligned) the epilogue area (see smem_for)
    uint32_t * dump;     // SPLIT: consumer warp c's part: words [c BN 8, (c + 1) BN 8)
    int * terms_col;     // SPLIT: the tile's column terms,
    float * terms_rowf;  // its rows' float terms
    int * terms_border;  // and offsets in ep.colcls
    int wg, warp, lane;
    int n_ewarps, ewarp;
    uint8_t * ep_stage;
    int * ep_colterm;
    uint8_t * ones;
    bool count_rows;
    const CUtensorMap * ymap;
    uint32_t dump_full, dump_empty;
    uint32_t mt, ntn;

    // The consumers' state: warpgroup cw, warp cwarp among the consumers; it, the stages' sequence
    // number; prev, the stage whose MMAs are still in flight; pc, the ones MMA's accumulators.
    int cw, cwarp, it, prev;
    int pc[4];
    uint64_t dones;
    int kwhole, klast;

    __device__ __forceinline__ wgmma_cta(uint8_t * smem_raw, const CUtensorMap & ta_, const CUtensorMap & tb_,
                                         const CUtensorMap & ty_, const int & y_mode_, const int64_t & M_,
                                         const int64_t & N_, const int & ktiles_, const gemm_epilogue & ep_,
                                         const gemm_gather & gs_)
        : ta(ta_), tb(tb_), ty(ty_), y_mode(y_mode_), M(M_), N(N_), ktiles(ktiles_), ep(ep_), gs(gs_) {
        base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023) & ~1023u; // swizzle atoms
        bars = base + STAGES * STAGE_BYTES;
        area = smem_raw + (bars + 1024 - (uint32_t)__cvta_generic_to_shared(smem_raw));
        dump = (uint32_t *)area;
        terms_col = (int *)(area + dump_for(BINARY, BN));
        terms_rowf = (float *)(area + dump_for(BINARY, BN) + 1024);
        terms_border = (int *)(area + dump_for(BINARY, BN) + 1536);
        wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
        // The epilogue warps. SPLIT (never with gathered rows, which take the whole producer
        // warpgroup): warps 1-3 of the producer warpgroup and the fourth warpgroup; else the
        // consumer warps.
        n_ewarps = epilogue_warps(BINARY, BN);
        ewarp = !SPLIT ? threadIdx.x / 32 - 4 : wg == 0 ? warp - 1 : 3 + warp;
        ep_stage = area + (SPLIT ? dump_for(BINARY, BN) + EP_TERMS : 0) + ewarp * EP_STAGE;
        ep_colterm = SPLIT ? terms_col : (int *)(area + n_ewarps * EP_STAGE + ewarp * EP_COLTERM);
        // A gathering GEMM's ones operand, after the epilogue areas (1024-byte aligned: they are
        // whole KBs); count_rows: the tile's rows are gathered and counted by the ones MMA.
        ones = area + (SPLIT ? 0 : n_ewarps * (EP_STAGE + EP_COLTERM));
        count_rows = ones_for(BINARY, BN) && gs.x;
        ymap = FAST && y_mode == Y_ROWS_MAP ? &ty : NULL;
        dump_full = bars + 16 * STAGES, dump_empty = dump_full + 8;
        mt = (uint32_t)((M + BM - 1) / BM), ntn = (uint32_t)((N + BN - 1) / BN); // (M, N < 2^31)
    }
    __device__ __forceinline__ uint32_t full(int s) const { return bars + 8 * s; }
    __device__ __forceinline__ uint32_t empty(int s) const { return bars + 8 * (STAGES + s); }
    // PP: turn(c) completes a phase when consumer warpgroup c has issued the MMAs of its next tile.
    __device__ __forceinline__ uint32_t turn(int c) const { return bars + 16 * STAGES + 16 + 8 * c; }

    __device__ __forceinline__ void init_barriers() {
        if (threadIdx.x == 0) {
            for (int s = 0; s < STAGES; s++) {
                mbar_init(full(s), gs.x ? 129 : 1);    // (gathering: every producer thread and the B load)
                mbar_init(empty(s), PP ? 4 : 4 * NCW); // one arrival per consumer warp that reads it
            }
            if (PP) {
                mbar_init(turn(0), 4);
                mbar_init(turn(1), 4);
            }
            if (SPLIT) {
                mbar_init(dump_full, 128 * NCW); // every consumer thread, then every epilogue thread
                mbar_init(dump_empty, 32 * n_ewarps);
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        if (count_rows) ones_operand(ones, ep.g.K);
        __syncthreads();
    }

    // The epilogue's popcount terms of a tile: popc(w) of its columns, and popc(x) and K of this
    // thread's fragment rows of a warp's 16 rows. They are loaded by the consumers before the
    // tile's MMAs so that their latency hides behind them (and used only after them), except in
    // the first tile of a GEMM that starts under the kernel writing them (ep.terms_last or
    // ep.operands_last), which waits for that kernel just after its MMAs. Gathered rows that the
    // tile counts itself (count_rows) take their K terms and border classes from their pixel's
    // entry in ep.pixcls, and their popcounts from the ones MMA (see ones_operand).
    struct row_terms {
        int rpop[2], rk[2], rborder[2]; // (rborder: the border class, then its offset in ep.colcls)
        float rowf[2];                  // K - 2 popc(x) - DOT_BIAS_F, made before the epilogue
    };
    __device__ __forceinline__ void load_cols(int * cpop, int64_t n0) const { // columns n0 + lane + 32 q
#pragma unroll
        for (int q = 0; q < NCP; q++) {
            const int64_t n = n0 + lane + 32 * q;
            cpop[q] = BINARY && FAST && !TAPS && n < N ? __ldg(ep.colpop + n) : 0;
        }
    }
    __device__ __forceinline__ void load_rows(row_terms & rt, int64_t mw) const {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t m = mw + lane / 4 + 8 * r;
            rt.rpop[r] = rt.rk[r] = rt.rborder[r] = 0;
            rt.rowf[r] = 0.0f;
            if (BINARY && FAST && m < M) {
                if (TAPS && count_rows) { // gathered rows: their pixel's terms (popc(x): the ones MMA's)
                    const uint32_t n = fast_div(fast_div((uint32_t)m, gs.div_ow), gs.div_oh);
                    const int2 t = __ldg(ep.pixcls + ((uint32_t)m - n * (uint32_t)(ep.g.OH * ep.g.OW)));
                    rt.rk[r] = t.x;
                    rt.rborder[r] = t.y;
                } else if (TAPS && ep.rowterms) { // gathered rows: terms made by bie_cuda_conv_rowpop
                    const int2 t = __ldg(ep.rowterms + m);
                    rt.rk[r] = t.x; // (K over the valid taps - 2 popc(x), with rpop 0)
                    rt.rborder[r] = t.y;
                } else if (TAPS) { // a zero-padded conv: K counts the valid taps only
                    const row_info ri = make_row(ep, m, M);
                    rt.rk[r] = (int)ri.kterm;
                    rt.rpop[r] = ri.rowpop;
                    rt.rborder[r] = ri.border;
                } else {
                    rt.rk[r] = (int)ep.g.K;
                    if (!count_rows) rt.rpop[r] = __ldg(ep.rowpop + m);
                }
            }
        }
    }
    // Before the epilogue of a tile at column nt: the row terms as floats, and the offsets of the
    // rows' column terms in ep.colcls (TAPS; the host keeps them below 2^31).
    __device__ __forceinline__ void prepare_rows(row_terms & rt, int64_t nt) const {
        if (BINARY && FAST) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                rt.rowf[r] = __fsub_rn(__int2float_rn(rt.rk[r] - 2 * rt.rpop[r]), DOT_BIAS_F);
                if (TAPS) rt.rborder[r] = rt.rborder[r] * ep.colcls_ld + (int)nt;
            }
        }
    }
    // The epilogue of a warp's 16 rows from mw of the tile at column nt (colterm: DOT_BIAS - 2
    // popc(w) of the tile's columns).
    __device__ __forceinline__ void finish(const acc_regs & d, const float * rowf, const int * rowborder,
                                           const int * rpop, int64_t mw, int64_t nt, float scale) const {
        if constexpr (std::is_same<T, bits_t>::value)
            epilogue_bits<BINARY, BN, TAPS>(ep, d, ep_stage, ep_colterm, mw, nt, M, N, rowf, rowborder);
        else
            epilogue<BINARY, BN, T, FAST, TAPS>(ep, d, ep_stage, ep_colterm, ymap, y_mode, mw, nt, M, N, scale, rowf,
                                                rowborder, rpop);
    }

    // SPLIT: the epilogue warps. y leaves by bulk stores (the host launches SPLIT only with a y
    // map): each tile's chunks (consumer warp, 128 bytes of its 16 rows) are dealt round-robin.
    __device__ __forceinline__ void split_epilogue() const {
        if constexpr (SPLIT) {
            if (ep.terms_last || ep.operands_last) griddep_wait(); // (the scales and border corrections)
            const float scale = __fmul_rn(ld_scale(ep.sa), ld_scale(ep.sw));
            constexpr int NC = BN / (128 / (int)sizeof(T)); // column chunks
            int j = 0;
            for (tile_walk w(blockIdx.x, gridDim.x, mt); w.ni < ntn; w.next(), j++) {
                const int64_t mt0 = (int64_t)w.mi * BM, nt = (int64_t)w.ni * BN;
                mbar_wait(dump_full, j & 1);
                for (int u = ewarp; u < 8 * NC; u += n_ewarps) { // (consumer warp, chunk)
                    const int cw8 = u / NC, c = u % NC, row = cw8 * 16 + lane / 4;
                    const float rf[2] = {terms_rowf[row], terms_rowf[row + 8]};
                    const int rb[2] = {TAPS ? terms_border[row] : 0, TAPS ? terms_border[row + 8] : 0};
                    epilogue_chunk<BINARY, T, TAPS>(ep, acc_dump{dump + cw8 * BN * 8}, ep_stage, ep_colterm, ymap,
                                                    mt0 + 16 * cw8, c, nt, M, scale, rf, rb);
                }
                mbar_arrive(dump_empty);
            }
            if (lane == 0) tma_store_wait_all(); // the stage must outlive its last store
        }
    }

    // Warpgroup 0: every stage of every tile of this CTA, in order (SPLIT: its warps 1-3 are
    // epilogue warps).
    __device__ __forceinline__ void producer() const {
        if constexpr (SPLIT) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SPLIT_HELPER_REGS));
        else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (ep.operands_last) griddep_wait(); // (before any load)
        if (gs.x) {
            if (gs.piece == 16) gather_producer<16, BM, BN, STAGES>(gs, &tb, ep.g, M, mt, ntn, ktiles, base, bars);
            else if (gs.piece == 8) gather_producer<8, BM, BN, STAGES>(gs, &tb, ep.g, M, mt, ntn, ktiles, base, bars);
            else gather_producer<4, BM, BN, STAGES>(gs, &tb, ep.g, M, mt, ntn, ktiles, base, bars);
            return;
        }
        if (SPLIT && warp > 0) {
            split_epilogue();
            return;
        }
        if (threadIdx.x != 0) return;
        tma_producer<BM, BN, STAGES>(&ta, &tb, mt, ntn, ktiles, base, bars);
    }

    // NK k-steps of one stage as one group (with the ones MMA beside each when count_rows).
    template <int NK> __device__ __forceinline__ void mma_group(int * d, uint64_t da, uint64_t db, int kt) {
        if (count_rows) {
            uint64_t dq[NK];
#pragma unroll
            for (int k = 0; k < NK; k++) dq[k] = dones + ones_slice(kt * (BK / 32) + k, kwhole);
            wg_fence();
#pragma unroll
            for (int k = 0; k < NK; k++) {
                wg_mma<BINARY, BN>(d, da + 2 * k, db + 2 * k, (kt | k) != 0);
                wg_b1_8(pc, da + 2 * k, dq[k], (kt | k) != 0);
            }
            wg_commit();
        } else {
            wg_fence();
#pragma unroll
            for (int k = 0; k < NK; k++) wg_mma<BINARY, BN>(d, da + 2 * k, db + 2 * k, (kt | k) != 0);
            wg_commit();
        }
    }
    // One stage of MMAs into d (kt: the stage's index in its tile); the stage before it goes back
    // to the producer once its MMAs are done (at most one group of MMAs stays in flight).
    __device__ __forceinline__ void mma_stage(int * d, int kt) {
        const int s = it % STAGES;
        mbar_wait(full(s), (it / STAGES) & 1);
        if (gs.x) fence_proxy_async(); // rows written by the producer's copies, read by the MMAs
        const uint32_t sa = base + s * STAGE_BYTES;
        const uint64_t da = smem_desc(sa + (PP ? 0 : cw * 64 * BK)), db = smem_desc(sa + BM * BK);
        // (A branch per stage, each side a whole fenced group: with the branch between the MMAs,
        // or around them only, ptxas fences them itself.)
        static_assert(BK / 32 == 4, "four k-steps a stage");
        const int nk = kt == ktiles - 1 ? klast : BK / 32;
        if (nk == 4) mma_group<4>(d, da, db, kt);
        else if (nk == 3) mma_group<3>(d, da, db, kt);
        else if (nk == 2) mma_group<2>(d, da, db, kt);
        else mma_group<1>(d, da, db, kt);
        wg_wait<1>(); // (unconditional, so that ptxas sees every earlier group retired here)
        if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
        prev = s;
        it++;
    }
    __device__ __forceinline__ void drain() {
        wg_wait<0>();
        if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
        prev = -1;
    }

    // SPLIT: the warp's accumulators and terms into its part of the dump (once the epilogue warps
    // have read the last tile's), for the epilogue warps (j: the tile's index among the CTA's).
    __device__ __forceinline__ void hand_over(const int * d, const int * cpop, const row_terms & rt, int j) {
        uint32_t * const part = dump + cwarp * BN * 8;
        mbar_wait(dump_empty, (j & 1) ^ 1);
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                part[(2 * i + h) * 32 + lane] = __byte_perm(d[4 * i + 2 * h], d[4 * i + 2 * h + 1], 0x5410);
        if (!TAPS && lane < BN / 8) terms_col[cwarp * (BN / 8) + lane] = DOT_BIAS - 2 * cpop[0];
        if (lane % 4 == 0)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                terms_rowf[cwarp * 16 + lane / 4 + 8 * h] = rt.rowf[h];
                if (TAPS) terms_border[cwarp * 16 + lane / 4 + 8 * h] = rt.rborder[h];
            }
        mbar_arrive(dump_full);
    }

    // Consumers: warpgroup cw computes rows [64 cw, 64 cw + 64) of every tile; PP: the whole of
    // every other tile (the CTA's tiles cw, cw + 2, ...).
    __device__ __forceinline__ void consumer() {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs(BINARY, BN)));
        cw = wg - 1, cwarp = cw * 4 + warp;
        // Gathered rows: pc, the ones MMA's accumulators (see ones_operand), gives the rows'
        // popcounts.
        it = 0, prev = -1;
        pc[0] = pc[1] = pc[2] = pc[3] = 0;
        dones = smem_desc((uint32_t)__cvta_generic_to_shared(ones));
        kwhole = (int)(ep.g.K / 256 < INT32_MAX ? ep.g.K / 256 : INT32_MAX);
        // The k-steps (32 bytes of K each) of a tile's last stage that hold any of K: those past
        // it, zeros in B, are not issued (3 of 4 at K = 576 bits, a 3x3 conv of 64 channels).
        // (1 to 4: the host rounds K's bytes up to whole stages, kbytes.)
        const int64_t kvbytes = BINARY ? (ep.g.K + 7) / 8 : ep.g.K;
        klast = (int)((kvbytes - (int64_t)(ktiles - 1) * BK + 31) / 32);

        int d[ACC];
#pragma unroll
        for (int i = 0; i < ACC; i++) d[i] = 0;
        const float scale = SPLIT ? 0.0f : __fmul_rn(ld_scale(ep.sa), ld_scale(ep.sw));
        // (SPLIT: consumer warp c loads the column terms of columns c BN/8 + lane, lane < BN/8, only)
        // j: the tile's index among the CTA's, the stages' sequence number from j * ktiles.
        const int j0 = PP ? cw : 0, dj = PP ? 2 : 1;
        const bool after_prev = ep.terms_last || ep.operands_last; // started under the kernel before
        tile_walk w(blockIdx.x, gridDim.x, mt);
        if (j0) w.next();
        for (int j = j0; w.ni < ntn; j += dj) {
            const int64_t mt0 = (int64_t)w.mi * BM, nt = (int64_t)w.ni * BN;
            const int64_t mw = mt0 + (PP ? 0 : cw * 64) + warp * 16; // this warp's first row
            const int64_t n0 = SPLIT ? nt + cwarp * (BN / 8) : nt;
            int cpop[NCP];
            row_terms rt;
            if (!(j == j0 && after_prev)) {
                load_cols(cpop, n0);
                load_rows(rt, mw);
            }
            if (PP) {
                // The main loops take turns: tile j's after tile j - 1's MMAs were issued (by the
                // other warpgroup). So every stage's previous fill has been waited for when this
                // one waits for the next (a parity wait cannot mistake one for the other), and the
                // epilogue of one warpgroup overlaps the other's MMAs.
                if (j > 0) mbar_wait(turn(1 - cw), ((j - 1) >> 1) & 1);
                it = j * ktiles;
            }
            for (int kt = 0; kt < ktiles; kt++) mma_stage(d, kt);
            if (PP && lane == 0) mbar_arrive(turn(cw));
            drain();
            pin<ACC>(d);
            pin<4>(pc);
            if (j == j0 && after_prev) {
                griddep_wait();
                load_cols(cpop, n0);
                load_rows(rt, mw);
            }
            // Gathered rows: this thread's two fragment rows' popcounts, column 0 of pc in lanes
            // 4q. (A copy of rt.rpop: the element-wise epilogue takes its address, and handed
            // rt.rpop, ptxas puts all of rt in local memory, 32 bytes of stack in the 64-column
            // kernels against 8.)
            int rpop[2] = {0, 0};
            if (count_rows) {
                rpop[0] = rt.rpop[0] = __shfl_sync(0xffffffffu, pc[0], lane & ~3);
                rpop[1] = rt.rpop[1] = __shfl_sync(0xffffffffu, pc[2], lane & ~3);
            }
            prepare_rows(rt, nt);
            if constexpr (SPLIT) {
                hand_over(d, cpop, rt, j);
            } else {
                if (BINARY && FAST && !TAPS) {
#pragma unroll
                    for (int q = 0; q < NCP; q++) ep_colterm[lane + 32 * q] = DOT_BIAS - 2 * cpop[q];
                    __syncwarp();
                }
                finish(acc_regs{d}, rt.rowf, rt.rborder, count_rows ? rpop : NULL, mw, nt, scale);
            }
            w.next();
            if (PP) w.next();
        }
        if (!SPLIT && ymap && lane == 0) tma_store_wait_all(); // the stage must outlive its last store
    }
};

#endif // BIE_WGMMA_DEVICE

template <bool BINARY, int BN, typename T, bool FAST, bool TAPS>
__global__ void __launch_bounds__(threads_for(BINARY, BN), 1)
    wgmma_gemm(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
               const __grid_constant__ CUtensorMap ty, int y_mode, int64_t M, int64_t N, int ktiles,
               const __grid_constant__ gemm_epilogue ep, const __grid_constant__ gemm_gather gs) {
#ifdef BIE_WGMMA_DEVICE
    extern __shared__ uint8_t smem_raw[];
    wgmma_cta<BINARY, BN, T, FAST, TAPS> cta(smem_raw, ta, tb, ty, y_mode, M, N, ktiles, ep, gs);
    cta.init_barriers();
    if (cta.wg == 0) {
        cta.producer();
        return;
    }
    if (split_for(BINARY, BN) && cta.wg == 1 + cw_for(BN)) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SPLIT_HELPER_REGS));
        cta.split_epilogue();
        return;
    }
    cta.consumer();
#endif
}

} // namespace

// An entry of the launch table: the instance wgmma_gemm<B, BN, T, F, TAPS> and its key.
#define WGMMA_KERNEL(B, BN, T, F, TAPS)                                                                                \
    { {B, BN, out_of<T>(), F, TAPS}, wgmma_gemm<B, BN, T, F, TAPS> }

// The instances that the dispatch (cuda-wgmma.cu) can choose, per tile width. n-bit: B1 y (sign
// bits), f16/bf16/f32 y by the FAST epilogue, and any y element by element (no border correction:
// zero-padded n-bit convs need none). Binary: the same, B1 and FAST ones each with and without the
// border correction of a zero-padded conv. SPLIT tiles store f16/bf16/f32 y by bulk copies only.
#define WGMMA_NBIT_KERNELS(BN)                                                                                         \
    WGMMA_KERNEL(false, BN, bits_t, true, false), WGMMA_KERNEL(false, BN, __half, true, false),                        \
        WGMMA_KERNEL(false, BN, __nv_bfloat16, true, false), WGMMA_KERNEL(false, BN, float, true, false),              \
        WGMMA_KERNEL(false, BN, float, false, false)
#define WGMMA_B1_KERNELS(BN)                                                                                           \
    WGMMA_KERNEL(true, BN, bits_t, true, true), WGMMA_KERNEL(true, BN, bits_t, true, false),                           \
        WGMMA_KERNEL(true, BN, __half, true, true), WGMMA_KERNEL(true, BN, __nv_bfloat16, true, true),                 \
        WGMMA_KERNEL(true, BN, float, true, true), WGMMA_KERNEL(true, BN, __half, true, false),                        \
        WGMMA_KERNEL(true, BN, __nv_bfloat16, true, false), WGMMA_KERNEL(true, BN, float, true, false),                \
        WGMMA_KERNEL(true, BN, float, false, false)
#define WGMMA_SPLIT_KERNELS(BN)                                                                                        \
    WGMMA_KERNEL(true, BN, __half, true, true), WGMMA_KERNEL(true, BN, __nv_bfloat16, true, true),                     \
        WGMMA_KERNEL(true, BN, float, true, true), WGMMA_KERNEL(true, BN, __half, true, false),                        \
        WGMMA_KERNEL(true, BN, __nv_bfloat16, true, false), WGMMA_KERNEL(true, BN, float, true, false)
