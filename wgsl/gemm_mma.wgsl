// Quantized weights times 8-bit activations for batches of tokens on the
// tensor cores (the Dawn tier: chromium_experimental_subgroup_matrix, f16
// inputs, f32 results). The same params, block readers and epilogues as
// gemm_mmq.wgsl, so the engine swaps one for the other by tile: the readers
// (mmq_{{QTYPE}}.wgsl) stage int8 lanes and per-32-value scales, this kernel
// turns them into f16 values (a q + b, or the 16-value scales of SCALE16) in
// a weight tile, the tokens' q8 rows into f16 values d q in a token tile,
// and the subgroups multiply 16 x 16 x 16 matrices of the two. (Token
// matrices loaded straight from an f16 copy of the rows in global memory
// were slower on the H200: 46 against 72 TOPS for Q4_K.)
//
// Numerics: each product is of the q8-rounded activation and the block's
// weight value, both rounded once more to f16 (relative 2^-11, well inside
// the q8 rounding the CPU reference applies), summed in f32.
//
// A workgroup owns BN staged weight rows x BT tokens; subgroup (sr, sc) of
// SGR x SGT holds TM x TN result matrices (rows sr TM 16 + 16a, tokens
// sc TN 16 + 16b; PAIR: matrices a < TM / 2 are gate rows and a + TM / 2 the
// same rows of up). Per stage of SUB sub-blocks (KS = 32 SUB values):
//   B  convert: the staged int8 lanes and scales (wq, ws) -> wh (f16,
//      [row][k], row stride LD); the fetched token vec4 -> xh ([token][k]);
//   C  products: TM x TN multiply-accumulates per 16 values of k,
// with the next stage's global loads issued before C and put into wq / ws
// after it: two barriers per stage. Results leave through a per-subgroup
// 16 x 16 scratch (ep) into matmul_common's row epilogue (bias, residual) or
// gemv_split's q|k|v store. Rows past N and tokens past T read row N - 1 /
// token T - 1 and are not stored. K % KS == 0. Dispatch
// (ceil(N_chunk / OUT_ROWS), ceil(T / BT), 1). XCOPY: the token tile is copied from q8_f16.wgsl's
// f16 rows (binding 12, T rounded up to BT rows) by subgroup matrix loads, fetched a stage ahead
// like the weights and stored in B: each token value is converted once per batch, not once per
// workgroup of its column. WCOPY: the weight tile likewise, from mma_dequant.wgsl's f16 rows
// (binding 13), converted once per product, not once per token tile; WVEC (WC 2) copies those rows by
// vec4 words into registers a stage ahead and f16 stores in B, as the tokens: on an H100 that ran at 149
// against 80 TOPS for the matrix loads and stores (perf/README.md, stop 35). XVEC (XC 2) copies the token
// rows so too. EXPERT (mmq_expert_on.wgsl, as gemm_mmq.wgsl): the
// token tiles are groups of (token, slot) pairs routed to one expert of a bank (kernels_moe). KP > 1
// (batched decode steps: few tokens, few workgroups, long K): KP groups of SGR x SGT subgroups share
// the workgroup's tiles, group p doing the products of the p-th KS / KP values of each stage; their
// sums meet in ep, added in group order, and group 0 stores them. KP times the subgroups in flight
// for the same tiles, where one group alone left most of the GPU idle waiting on its loads.
// VW 1: wh, xh and ep are views of one workgroup buffer (bufferView): ep, used only after the last stage,
// reuses the tiles' bytes, and the tiles take 8- and 16-byte stores where VW 0 stores each f16 alone.
// DIRECT (WC 3; Q4_K, Q6_K, Q8_0, Q5_0): no dequantizing pass and no wq / ws staging: each invocation's
// fetched units (the readers' Raw, a stage ahead) become f16 values in wh in B (mma_direct_TYPE.wgsl).

enable chromium_experimental_subgroup_matrix;

{{EXPERT}}
// #include mmq_reader
// #include mmq_{{QTYPE}}

const BN: u32 = {{BN}}u;    // staged weight rows per tile
const BT: u32 = {{BT}}u;    // tokens per tile
const SUB: u32 = {{SUB}}u;  // sub-blocks per stage: 2, 4 or 8
const SGR: u32 = {{SGR}}u;  // subgroups along rows
const SGT: u32 = {{SGT}}u;  // subgroups along tokens
const KP: u32 = {{KP}}u;    // subgroup groups splitting each stage's k values
const SG: u32 = {{SG}}u;    // subgroup size
const TM: u32 = {{TM}}u;    // result matrices per subgroup along rows (BN / SGR / 16)
const TN: u32 = {{TN}}u;    // along tokens (BT / SGT / 16)
const PAD: u32 = {{PAD}}u;
const PAIR: bool = {{PAIR}};
// The token tiles of one row tile are neighbours in launch order (matmul_common's grid_cell): they
// run together and share the weight tile's reads in the cache (not with expert tiles: their y is a group).
const TOKENS_FIRST: bool = {{TOKENS_FIRST}};
{{ACT_TABLE}}
const CONVERT: bool = {{CONVERT}};  // false only when timing the products alone
const XCOPY: bool = {{XCOPY}};
const WCOPY: bool = {{WCOPY}};
const WVEC: bool = {{WVEC}};  // WCOPY by vec4 loads into registers and f16 stores, not matrix loads and stores
const XVEC: bool = {{XVEC}};  // XCOPY so too
// WC 3: each invocation turns its fetched units straight into wh (mma_direct_{{QTYPE}}.wgsl's unit_f16), no
// wq / ws staging and no dequantizing pre-pass: 128 x 128 tiles fit without them
const DIRECT: bool = {{DIRECT}};
{{X16}}
{{W16}}
const WG: u32 = KP * SGR * SGT * SG;
const KS: u32 = 32u * SUB;   // k values per stage
const LD: u32 = KS + PAD;    // f16 stride of a tile row
const XV: u32 = 2u * SUB;    // int8 vec4 per row (or token) per stage
const OUT_ROWS: u32 = select(BN, BN / 2u, PAIR);
const NU: u32 = (BN * UNITS + WG - 1u) / WG;  // weight units per invocation per stage
const NX: u32 = (BT * XV + WG - 1u) / WG;     // token vec4 per invocation per stage
const NW: u32 = (BN * KS / 8u + WG - 1u) / WG;  // 8-value weight groups converted per invocation
const NWV: u32 = select(0u, BN * KS / 8u, WVEC);  // words (8 f16 values) of the weight tile copied a stage (WVEC)
const NXV: u32 = select(0u, BT * KS / 8u, XVEC);  // of the token tile (XVEC)
const NVA: u32 = max((NWV + NXV + WG - 1u) / WG, 1u);  // of both per invocation
const WQN: u32 = {{WQN}}u;  // XV BN, or 1 (unused) with WCOPY
const WSN: u32 = {{WSN}}u;  // SUB BN, or 1

{{SMEM}}
var<workgroup> partial: array<f32, 1>;  // matmul_common's finish_row needs the name; unused here

// #include mma_stage
// #include {{DIRECT_FNS}}

// One stage's global loads in registers: the invocation's weight units, and its
// token vec4 with the (d_a, s_a, d_b, s_b) of their sub-block pair.
struct Staged {
    u: array<Raw, NU>,
    x: array<vec4<u32>, {{NXA}}>,  // NX, or 1 (unused) with XCOPY
    d: array<vec4<u32>, {{NXA}}>,
    v: array<vec4<u32>, NVA>,  // WVEC / XVEC: the invocation's words of both tiles (vec_fetch), or 1 (unused)
}

fn fetch(st: u32, tid: u32, first: u32, tok0: u32) -> Staged {
    let k0 = st * KS;
    var g: Staged;
    if (!WCOPY) {
        g.u = fetch_units(k0, tid, first);
    }
    if (WVEC || XVEC) {
        g.v = vec_fetch(k0, tid, first, tok0);
    }
    for (var n = 0u; n < select(NX, 0u, XCOPY); n++) {
        let k = tid + n * WG;
        if (k < BT * XV) {
            let t = x_tok(tok0, k / XV);
            let v = k % XV;
            g.x[n] = xq[t * params.x_stride + k0 / 16u + v];
            g.d[n] = xq[t * params.x_stride + params.K / 16u + k0 / 64u + v / 4u];
        }
    }
    return g;
}

fn put_weights(g: Staged, st: u32, tid: u32, first: u32) {
    if (!WCOPY && !DIRECT) {
        put_units(g.u, st * KS, tid, first);
    }
}

{{VEC_FNS}}

// WVEC / XVEC: the invocation's words of the stage at value k0, weights' first (mma_wvec_on.wgsl's w_word,
// mma_xvec_on.wgsl's x_word), fetched into registers a stage ahead.
fn vec_fetch(k0: u32, tid: u32, first: u32, tok0: u32) -> array<vec4<u32>, NVA> {
    var w: array<vec4<u32>, NVA>;
    for (var n = 0u; n < NVA; n++) {
        let i = tid + n * WG;
        if (i < NWV) {
            w[n] = w_word(i, k0, first);
        } else if (i < NWV + NXV) {
            w[n] = x_word(i - NWV, k0, tok0);
        }
    }
    return w;
}

// B, WVEC / XVEC: the fetched words as f16 values into wh / xh.
fn vec_put(w: array<vec4<u32>, NVA>, tid: u32) {
{{VIEW_LETS}}
    for (var n = 0u; n < NVA; n++) {
        let i = tid + n * WG;
        let j = select(i - NWV, i, i < NWV);
        let o = (j / (KS / 8u)) * LD + 8u * (j % (KS / 8u));
{{VEC_PUT}}
    }
}

// Stage-local vec4 v (quantize_q8's order) -> (sub-block, half): the inverse of qv.
fn sub_half(v: u32) -> vec2<u32> {
    return vec2<u32>(2u * (v / 4u) + (v % 2u), (v % 4u) / 2u);
}

// Four f16 values into wh at o (DIRECT's unit_f16; o a multiple of 4, which VW's one 8-byte store needs).
fn put4(o: u32, v: vec4<f16>) {
{{VIEW_LETS}}
{{PUT4}}
}

// B: the staged weights (DIRECT: the fetched units of stage st) and the fetched tokens as f16 tiles.
fn convert(g: Staged, tid: u32, st: u32, first: u32) {
{{VIEW_LETS}}
    if (WVEC || XVEC) {
        vec_put(g.v, tid);
    }
    if (DIRECT) {
        for (var n = 0u; n < NU; n++) {
            let k = tid + n * WG;
            if (k < BN * UNITS) {
                let at = staged_row(k / UNITS, first);
                unit_f16(g.u[n], at.y, st * KS, k % UNITS, k / UNITS);
            }
        }
    }
    for (var n = 0u; n < select(NW, 0u, WCOPY || DIRECT); n++) {
        let i = tid + n * WG;
        if (i < BN * KS / 8u) {
            let rho = i / (KS / 8u);
            let k = 8u * (i % (KS / 8u));  // stage-local value
            let v = weight8(rho, k);
            let o = rho * LD + k;
{{PUT8}}
        }
    }
    for (var n = 0u; n < select(NX, 0u, XCOPY); n++) {
        let i = tid + n * WG;
        if (i < BT * XV) {
            let tau = i / XV;
            let sh = sub_half(i % XV);
            let d4 = bitcast<vec4<f32>>(g.d[n]);
            let d = vec4<f32>(select(d4.x, d4.z, sh.x % 2u == 1u));
            let o = tau * LD + 32u * sh.x + 16u * sh.y;
            for (var c = 0u; c < 4u; c++) {
                let v = vec4<f16>(d * vec4<f32>(unpack4xI8(g.x[n][c])));
{{XPUT4}}
            }
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
{{VIEW_LETS}}
    let cell = grid_cell(wid, nwg, TOKENS_FIRST);  // (row tile, token tile)
    if (tile_skip(cell.y)) {  // EXPERT: no pairs, or its expert in another binding
        return;
    }
    let first = cell.x * OUT_ROWS;  // the tile's first output row (of this chunk)
    let tok0 = tile_tok0(cell.y);
    let sr = sg % SGR;
    let sc = (sg / SGR) % SGT;
    let kp = sg / (SGR * SGT);  // KP: this subgroup's group
    let nst = params.K / KS;
    if (INIT) {
        reader_init(tid);
        workgroupBarrier();
    }
{{ACC_DECL}}
    var g = fetch(0u, tid, first, tok0);
{{XM_DECL}}
    put_weights(g, 0u, tid, first);
    workgroupBarrier();
    for (var st = 0u; st < nst; st++) {
        if (CONVERT) {
            convert(g, tid, st, first);
        }
{{XM_STORE}}
        workgroupBarrier();
        let ahead = st + 1u < nst;
        if (ahead) {
            g = fetch(st + 1u, tid, first, tok0);  // in flight during the products
{{XM_LOAD}}
        }
        for (var kq = 0u; kq < KS / KP; kq += 16u) {
            let kk = kp * (KS / KP) + kq;
{{PRODUCTS}}
        }
        if (ahead) {
            put_weights(g, st + 1u, tid, first);
        }
        workgroupBarrier();
    }
    let scratch = sg * 256u;
{{EPILOGUE}}
}

// XCOPY: token matrix j of subgroup sg in a stage, (token rows of 16, values of 16) of the tile's
// (BT / 16) x (KS / 16): its offset in x16 at stage st (in xh: tile_at).
fn x16_at(sg: u32, j: u32, st: u32, tok0: u32) -> u32 {
    let i = sg + j * SGR * SGT;
    return (tok0 + (i / (KS / 16u)) * 16u) * params.K + st * KS + (i % (KS / 16u)) * 16u;
}

// WCOPY: weight matrix j of subgroup sg in a stage, of the tile's (BN / 16) x (KS / 16): its offset
// in w16 (mma_dequant.wgsl's f16 rows) at stage st (in wh: tile_at).
fn w16_at(sg: u32, j: u32, st: u32, first: u32) -> u32 {
    let i = sg + j * SGR * SGT;
    return f16_row((i / (KS / 16u)) * 16u, first) * params.K + st * KS + (i % (KS / 16u)) * 16u;
}

// Matrix j of subgroup sg in a stage's workgroup tile (wh or xh, both [row][k] of stride LD).
fn tile_at(sg: u32, j: u32) -> u32 {
    let i = sg + j * SGR * SGT;
    return (i / (KS / 16u)) * 16u * LD + (i % (KS / 16u)) * 16u;
}

// The pair's activation of its gate (PAIR_ACT: silu, gelu, or gelu_f16 with its table at binding 11,
// as gemm_mmq.wgsl's).
fn pair_act(g: f32) -> f32 {
    return {{PAIR_ACT}}(g);
}

// One output matrix of this subgroup through ep: rows row0 + m, the tile's tokens t0 + n
// (ep column-major: element (m, n) at 16 n + m); `other` the matching up
// matrix's values (PAIR) as this lane read them. KP: the sum of every group's matrix in that place.
fn out_values(scratch: u32, lane: u32) -> array<f32, 8> {
{{VIEW_LETS}}
    var v: array<f32, 8>;
    let base = scratch % (SGR * SGT * 256u);
    for (var e = 0u; e < 8u; e++) {
        var x = ep[base + lane + 32u * e];
        for (var p = 1u; p < KP; p++) {
            x += ep[base + p * SGR * SGT * 256u + lane + 32u * e];
        }
        v[e] = x;
    }
    return v;
}

fn store_values(v: array<f32, 8>, up: array<f32, 8>, lane: u32, row0: u32, tok0: u32, t0: u32) {
    for (var e = 0u; e < 8u; e++) {
        let idx = lane + 32u * e;
        let r = row0 + idx % 16u;
        let t = out_tok(tok0, t0 + idx / 16u);
        if (r < params.N && t != NO_TOKEN) {
            var x = v[e];
            if (PAIR) {
                x = pair_act(x) * up[e];
            }
            {{STORE}}(r, t, x);
        }
    }
}
