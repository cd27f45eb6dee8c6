// gemm_mma.wgsl's stage of BN weight rows x SUB sub-blocks as the block readers (mmq_TYPE.wgsl)
// stage it, int8 lanes and scale terms in workgroup memory (wq, ws), and their f16 values 8 at a
// time (mma_values.wgsl, as mma_dequant.wgsl makes them). The includer declares BN, SUB, XV (2 SUB), WG, NU,
// PAIR, WQN and WSN (XV BN and SUB BN, or 1 where it copies f16 rows instead).
// #include mma_values

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

// Staged row rho's values k .. k + 8 of the stage (k % 8 == 0), as mma_values.wgsl makes them.
fn weight8(rho: u32, k: u32) -> array<vec4<f16>, 2> {
    let sl = k / 32u;
    return values8(wq[rho * XV + qv(sl, (k % 32u) / 16u)], ws[rho * SUB + sl], k);
}
