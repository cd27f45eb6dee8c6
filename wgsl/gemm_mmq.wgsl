// Quantized weights times 8-bit activations for batches of tokens ("mmq"):
// integer dot products (dot4I8Packed) of int8 weight lanes with the int8 q of
// quantize_q8.wgsl in a tiled GEMM, so each weight block is read once per BT
// tokens instead of once per token. One kernel for every type: the block
// reader mmq_{{QTYPE}}.wgsl turns a type's blocks into int8 lanes and per
// 32-value scale terms while they are staged, and the tile, the products and
// the epilogues here do not know the type.
//
// A workgroup owns BN staged weight rows x BT tokens; invocation (tr, tt)
// keeps RM x RT sums: rows tr + i TR and tokens tt + j TT (strided, so the
// stores of neighbouring invocations are neighbouring floats). The K loop
// stages SUB sub-blocks (32 values each) at a time into workgroup memory:
//   wq  the weights as int8, 16 bytes per vec4, in quantize_q8's value order
//       (stage-local vec4 qv(s, h) holds values [16h, 16h + 16) of sub-block
//       s), [buf][vec4][row];
//   ws  per row and sub-block (a, b): a = the weight scale, b = the min term's
//       factor (MIN_TERM: value = a q + b) or, SCALE16 (Q6_K), the scale of
//       the sub-block's second 16 values (a then scales the first 16);
//   xs, xd  the tokens' q bytes and their per-pair (d_a, s_a, d_b, s_b)
//       (s = d * sum q), [buf][vec4 or pair][token].
// Per sub-block, row r, token t (isum: the exact integer sum of 32 products):
//   acc += a_r d_t isum (+ b_r s_t)    or, SCALE16,  d_t (a_r isum_lo + b_r isum_hi).
// An integer sum below 2^22 in magnitude becomes a float without a conversion
// instruction: dot4I8Packed chains start at the bits of 1.5 * 2^23, whose
// mantissa then holds the sum exactly (exact_f32).
// Workgroup tiles are stored [vec4][row] so one load phase of neighbouring
// rows (or tokens) is contiguous; the row XOR (v & 7) swizzle spreads the
// stores of one row's vec4s over the banks.
//
// PREFETCH 0: stage, barrier, multiply, barrier. 1: two workgroup buffers,
// stage n + 1 written while stage n is multiplied, one barrier per stage. 2:
// as 1, and stage n + 1's global loads issued into registers (fetch) before
// stage n's products, decoded into workgroup memory (put) after them.
//
// PAIR (the fused gate||up): staged rows [0, BN/2) are gate rows of `w`,
// [BN/2, BN) the same rows of `w2`; an invocation's slots i < RM/2 hold gate,
// i + RM/2 the matching up row; the output is pair_act(gate) * up, BN/2 rows per
// tile (gelu_f16: its table at binding 11). SPLIT (the fused q|k|v): store_split of gemv_split.wgsl. Params and
// the row epilogue come from matmul_common.wgsl (x_stride: vec4 between
// tokens of xq). Rows past N and tokens past T read row N - 1 / token T - 1
// and are not stored. K % (32 SUB) == 0 (kernels_mmq.MmqTile.fit_k; quantize_q8's layout needs
// whole 64s). Dispatch
// (ceil(N_chunk / OUT_ROWS), ceil(T / BT), 1). EXPERT (mmq_expert_on.wgsl): the tiles are
// groups of (token, slot) pairs routed to one expert of a bank (kernels_moe).

{{EXPERT}}
{{ACT_TABLE}}
// #include mmq_reader
// #include mmq_{{QTYPE}}

const BN: u32 = {{BN}}u;    // staged weight rows per tile
const BT: u32 = {{BT}}u;    // tokens per tile
const RM: u32 = {{RM}}u;    // rows per invocation
const RT: u32 = {{RT}}u;    // tokens per invocation
const SUB: u32 = {{SUB}}u;  // sub-blocks per stage: 2, 4 or 8
const PREFETCH: u32 = {{PREFETCH}}u;
const NB: u32 = {{NB}}u;    // workgroup buffers: 1, or 2 with PREFETCH
const PAIR: bool = {{PAIR}};
const DIRECT: bool = false;  // the readers' fetch for gemm_mma's WC 3 (mmq_q6_k.wgsl)
// The token tiles of one row tile are neighbours in launch order (matmul_common's grid_cell): they
// run together and share the weight tile's reads in the cache (not with expert tiles: their y is a group).
const TOKENS_FIRST: bool = {{TOKENS_FIRST}};
const TR: u32 = BN / RM;
const TT: u32 = BT / RT;
const WG: u32 = TR * TT;
const XV: u32 = 2u * SUB;   // int8 vec4 per row (or token) per stage
const P: u32 = SUB / 2u;    // sub-block pairs per stage
const OUT_ROWS: u32 = select(BN, BN / 2u, PAIR);
const NU: u32 = (BN * UNITS + WG - 1u) / WG;  // per invocation per stage: weight units,
const NX: u32 = (BT * XV + WG - 1u) / WG;     // activation vec4,
const ND: u32 = (BT * P + WG - 1u) / WG;      // activation scale vec4
const SWR: u32 = {{SWR}}u;  // 7: swizzle the row index (TR % 8 == 0, so rows tr + i TR share tr's low bits); 0: none
const SWT: u32 = {{SWT}}u;  // the same for tokens (TT % 8 == 0)
// The pair's activation of its gate (PAIR_ACT: silu, gelu, or gelu_f16 with its table, as gemv.wgsl's).
fn pair_act(g: f32) -> f32 {
    return {{PAIR_ACT}}(g);
}

const MAGIC: i32 = 0x4B400000;  // the bits of 1.5 * 2^23
const MAGIC_F: f32 = 12582912.0;

var<workgroup> wq: array<vec4<u32>, NB * XV * BN>;
var<workgroup> ws: array<vec2<f32>, NB * SUB * BN>;
var<workgroup> xs: array<vec4<u32>, NB * XV * BT>;
var<workgroup> xd: array<vec4<f32>, NB * P * BT>;
var<workgroup> partial: array<f32, 1>;  // matmul_common's finish_row needs the name; unused here

// --- what the block readers use (besides mmq_reader.wgsl) ------------------------------------

fn put_q(buf: u32, rho: u32, v: u32, q: vec4<u32>) {
    wq[(buf * XV + v) * BN + (rho ^ (v & SWR))] = q;
}

fn put_s(buf: u32, rho: u32, sl: u32, s: vec2<f32>) {
    ws[(buf * SUB + sl) * BN + rho] = s;
}

// --- staging --------------------------------------------------------------------------------

// One stage's global loads held in registers (PREFETCH 2): the invocation's
// weight units and activation vec4 (entry n: item tid + n WG of each list).
struct Staged {
    u: array<Raw, NU>,
    x: array<vec4<u32>, NX>,
    d: array<vec4<u32>, ND>,
}

fn fetch(st: u32, tid: u32, first: u32, tok0: u32) -> Staged {
    let k0 = st * 32u * SUB;
    var g: Staged;
    g.u = fetch_units(k0, tid, first);
    for (var n = 0u; n < NX; n++) {
        let k = tid + n * WG;
        if (k < BT * XV) {
            let t = x_tok(tok0, k / XV);
            g.x[n] = xq[t * params.x_stride + k0 / 16u + k % XV];
        }
    }
    for (var n = 0u; n < ND; n++) {
        let k = tid + n * WG;
        if (k < BT * P) {
            let t = x_tok(tok0, k / P);
            g.d[n] = xq[t * params.x_stride + params.K / 16u + k0 / 64u + k % P];
        }
    }
    return g;
}

fn put(g: Staged, st: u32, buf: u32, tid: u32, first: u32) {
    let k0 = st * 32u * SUB;
    for (var n = 0u; n < NU; n++) {
        let k = tid + n * WG;
        if (k < BN * UNITS) {
            let at = staged_row(k / UNITS, first);
            put_unit(g.u[n], at.y, k0, k % UNITS, k / UNITS, buf);
        }
    }
    for (var n = 0u; n < NX; n++) {
        let k = tid + n * WG;
        if (k < BT * XV) {
            let v = k % XV;
            xs[(buf * XV + v) * BT + ((k / XV) ^ (v & SWT))] = g.x[n];
        }
    }
    for (var n = 0u; n < ND; n++) {
        let k = tid + n * WG;
        if (k < BT * P) {
            xd[(buf * P + k % P) * BT + k / P] = bitcast<vec4<f32>>(g.d[n]);
        }
    }
}

// Stage st straight into buffer `buf` (PREFETCH 0 and 1): each unit's loads,
// then its decode, without the register arrays of fetch / put.
fn stage(st: u32, buf: u32, tid: u32, first: u32, tok0: u32) {
    let k0 = st * 32u * SUB;
    for (var n = 0u; n < NU; n++) {
        let k = tid + n * WG;
        if (k < BN * UNITS) {
            let at = staged_row(k / UNITS, first);
            put_unit(fetch_unit(at.x, at.y, k0, k % UNITS), at.y, k0, k % UNITS, k / UNITS, buf);
        }
    }
    for (var n = 0u; n < NX; n++) {
        let k = tid + n * WG;
        if (k < BT * XV) {
            let tau = k / XV;
            let v = k % XV;
            let t = x_tok(tok0, tau);
            xs[(buf * XV + v) * BT + (tau ^ (v & SWT))] = xq[t * params.x_stride + k0 / 16u + v];
        }
    }
    for (var n = 0u; n < ND; n++) {
        let k = tid + n * WG;
        if (k < BT * P) {
            let tau = k / P;
            let t = x_tok(tok0, tau);
            xd[(buf * P + k % P) * BT + tau] = bitcast<vec4<f32>>(xq[t * params.x_stride + params.K / 16u + k0 / 64u + k % P]);
        }
    }
}

// --- products -------------------------------------------------------------------------------

fn dot16(q: vec4<u32>, x: vec4<u32>, acc: i32) -> i32 {
    return acc + dot4I8Packed(q.x, x.x) + dot4I8Packed(q.y, x.y) + dot4I8Packed(q.z, x.z) + dot4I8Packed(q.w, x.w);
}

// s - MAGIC as a float, exactly (|s - MAGIC| < 2^22: 32 products of int8 by int8 at most 2^19).
fn exact_f32(s: i32) -> f32 {
    return bitcast<f32>(s) - MAGIC_F;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let tr = tid % TR;
    let tt = tid / TR;
    let cell = grid_cell(wid, nwg, TOKENS_FIRST);  // (row tile, token tile)
    if (tile_skip(cell.y)) {  // EXPERT: no pairs, or its expert in another binding
        return;
    }
    let first = cell.x * OUT_ROWS;  // the tile's first output row (of this chunk)
    let tok0 = tile_tok0(cell.y);
    var acc: array<f32, RM * RT>;
    let nst = params.K / (32u * SUB);  // stages
    if (INIT) {
        reader_init(tid);  // tables the reader's put_unit reads
        workgroupBarrier();
    }
    var g: Staged;
    if (PREFETCH == 2u) {
        put(fetch(0u, tid, first, tok0), 0u, 0u, tid, first);
        workgroupBarrier();
    } else if (PREFETCH == 1u) {
        stage(0u, 0u, tid, first, tok0);
        workgroupBarrier();
    }
    for (var st = 0u; st < nst; st++) {
        let cb = select(0u, st & 1u, PREFETCH != 0u);  // the buffer multiplied now
        let ahead = st + 1u < nst;
        if (PREFETCH == 0u) {
            stage(st, 0u, tid, first, tok0);
            workgroupBarrier();
        } else if (PREFETCH == 1u && ahead) {
            stage(st + 1u, cb ^ 1u, tid, first, tok0);
        } else if (PREFETCH == 2u && ahead) {
            g = fetch(st + 1u, tid, first, tok0);  // in flight while this stage is multiplied
        }
        for (var sl = 0u; sl < SUB; sl++) {
            let va = qv(sl, 0u);
            let vb = va + 2u;
            let wa0 = (cb * XV + va) * BN + (tr ^ (va & SWR));
            let wb0 = (cb * XV + vb) * BN + (tr ^ (vb & SWR));
            let s0 = (cb * SUB + sl) * BN + tr;
            var qa: array<vec4<u32>, RM>;  // values 0..15 of the sub-block, per row
            var qb: array<vec4<u32>, RM>;  // values 16..31
            var sw: array<vec2<f32>, RM>;
            for (var i = 0u; i < RM; i++) {
                qa[i] = wq[wa0 + i * TR];
                qb[i] = wq[wb0 + i * TR];
                sw[i] = ws[s0 + i * TR];
            }
            let xa0 = (cb * XV + va) * BT + (tt ^ (va & SWT));
            let xb0 = (cb * XV + vb) * BT + (tt ^ (vb & SWT));
            let d0 = (cb * P + sl / 2u) * BT + tt;
            for (var j = 0u; j < RT; j++) {
                let xa = xs[xa0 + j * TT];
                let xb = xs[xb0 + j * TT];
                let d4 = xd[d0 + j * TT];
                let sx = select(d4.xy, d4.zw, sl % 2u == 1u);  // (d, d * sum q) of this sub-block
                for (var i = 0u; i < RM; i++) {
                    let o = i * RT + j;
                    if (SCALE16) {
                        let fa = exact_f32(dot16(qa[i], xa, MAGIC));
                        let fb = exact_f32(dot16(qb[i], xb, MAGIC));
                        acc[o] = fma(sx.x, fma(sw[i].x, fa, sw[i].y * fb), acc[o]);
                    } else {
                        let f = exact_f32(dot16(qb[i], xb, dot16(qa[i], xa, MAGIC)));
                        acc[o] = fma(sw[i].x * sx.x, f, acc[o]);
                        if (MIN_TERM) {
                            acc[o] = fma(sw[i].y, sx.y, acc[o]);
                        }
                    }
                }
            }
        }
        if (PREFETCH == 2u && ahead) {
            put(g, st + 1u, cb ^ 1u, tid, first);
        }
        workgroupBarrier();  // PREFETCH 0: the buffer is restaged next; else: the next buffer is complete
    }

    for (var i = 0u; i < select(RM, RM / 2u, PAIR); i++) {
        let r = first + tr + i * TR;
        for (var j = 0u; j < RT; j++) {
            let t = out_tok(tok0, tt + j * TT);
            if (r < params.N && t != NO_TOKEN) {
                var v = acc[i * RT + j];
                if (PAIR) {
                    v = pair_act(v) * acc[(i + RM / 2u) * RT + j];
                }
                {{STORE}}(r, t, v);
            }
        }
    }
}
