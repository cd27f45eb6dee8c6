// What gemm_mma.wgsl and mma_dequant.wgsl share: one stage of BN weight rows x SUB sub-blocks
// as the block readers (mmq_TYPE.wgsl) stage it, int8 lanes and scale terms in workgroup memory
// (wq, ws), and their f16 values 8 at a time. The includer declares BN, SUB, XV (2 SUB), WG, NU,
// PAIR, WQN and WSN (XV BN and SUB BN, or 1 where it copies f16 rows instead).

var<workgroup> wq: array<vec4<u32>, WQN>;  // the readers' int8 lanes, [row][vec4]
var<workgroup> ws: array<vec2<f32>, WSN>;  // their scale terms, [row][sub-block]

fn put_q(buf: u32, rho: u32, v: u32, q: vec4<u32>) {
    wq[rho * XV + v] = q;
}

fn put_s(buf: u32, rho: u32, sl: u32, s: vec2<f32>) {
    ws[rho * SUB + sl] = s;
}

// The invocation's fetched units of the stage at value k0 into wq / ws.
fn put_units(u: array<Raw, NU>, k0: u32, tid: u32, first: u32) {
    for (var n = 0u; n < NU; n++) {
        let k = tid + n * WG;
        if (k < BN * UNITS) {
            let at = staged_row(k / UNITS, first);
            put_unit(u[n], at.y, k0, k % UNITS, k / UNITS, 0u);
        }
    }
}

// Staged row rho's values k .. k + 8 of the stage (k % 8 == 0): a q + b per value (a the
// sub-block's scale, or its 16-value half's with SCALE16; b its min term), each rounded to f16.
fn weight8(rho: u32, k: u32) -> array<vec4<f16>, 2> {
    let sl = k / 32u;
    let hf = (k % 32u) / 16u;
    let q4 = wq[rho * XV + qv(sl, hf)];
    let j = (k % 16u) / 4u;  // the first of two words
    let qa = vec4<f32>(unpack4xI8(q4[j]));
    let qb = vec4<f32>(unpack4xI8(q4[j + 1u]));
    let s = ws[rho * SUB + sl];
    var a = s.x;
    var b = vec4<f32>(0.0);
    if (SCALE16) {
        a = select(s.x, s.y, hf == 1u);
    } else if (MIN_TERM) {
        b = vec4<f32>(s.y);
    }
    return array<vec4<f16>, 2>(vec4<f16>(fma(vec4<f32>(a), qa, b)), vec4<f16>(fma(vec4<f32>(a), qb, b)));
}

// The f16 row a staged row rho of the tile at `first` is copied to / from (mma_dequant's output,
// gemm_mma's WCOPY input): a pair's up rows follow its gate rows, each half padded to 128 rows.
fn f16_row(rho: u32, first: u32) -> u32 {
    if (PAIR && rho >= BN / 2u) {
        return (params.N + 127u) / 128u * 128u + first + rho - BN / 2u;
    }
    return first + rho;
}
