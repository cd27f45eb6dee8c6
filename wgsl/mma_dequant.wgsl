// A weight chunk's rows as f16 values, [row][K], for the tensor-core kernel's WCOPY tiles
// (gemm_mma.wgsl copies its weight tiles from them): each block is turned into values once per
// product, not once per token tile. The same readers, staging and rounding as gemm_mma's own
// conversion (mma_stage.wgsl), so either way gives the same bits. (Each invocation turning its own
// items from registers, no staging and no barrier, ran 3x slower on an H100: 828 against 261 us
// for the 8B's gate+up, perf/README.md stop 39.)
//
// A workgroup stages BN rows (PAIR: BN / 2 rows of gate, binding 1, and of up, binding 6) a stage
// of KS values at a time, for SPW stages. Rows are padded to 128 per half (mma_stage's f16_row);
// rows past N copy row N - 1. Dispatch (ceil(N / OUT_ROWS) rounded up to 128 rows, ceil(K / (KS SPW)), 1).
// DIRECT (kernels_mma.DIRECT_TYPES): each invocation turns its fetched units into f16 values in a workgroup tile wh
// by mma_direct_{{QTYPE}}.wgsl's unit_f16, as gemm_mma's WC 3 tiles do, not through the staged lanes:
// the form that checks those tiles' conversion on adapters without subgroup matrices.

// #include mmq_expert_none
// #include mmq_reader
// #include mmq_{{QTYPE}}

const BN: u32 = 64u;
const SUB: u32 = 2u;
const SPW: u32 = 8u;  // stages per workgroup
const PAIR: bool = {{PAIR}};
const WG: u32 = 256u;
const KS: u32 = 32u * SUB;
const XV: u32 = 2u * SUB;
const OUT_ROWS: u32 = select(BN, BN / 2u, PAIR);
const NU: u32 = (BN * UNITS + WG - 1u) / WG;
const DIRECT: bool = {{DIRECT}};
const WQN: u32 = select(XV * BN, 1u, DIRECT);
const WSN: u32 = select(SUB * BN, 1u, DIRECT);
const LD: u32 = KS;  // DIRECT: wh's row stride

@group(0) @binding(13) var<storage, read_write> w16: array<vec4<u32>>;  // 8 f16 per vec4
var<workgroup> partial: array<f32, 1>;  // matmul_common's finish_row needs the name; unused here

// #include mma_stage
// #include {{DIRECT_FNS}}

var<workgroup> wh: array<f16, select(1u, BN * LD, DIRECT)>;

fn put4(o: u32, v: vec4<f16>) {
    wh[o] = v.x; wh[o + 1u] = v.y; wh[o + 2u] = v.z; wh[o + 3u] = v.w;
}

// Staged row rho's values k .. k + 8 of the stage: weight8's, or with DIRECT those unit_f16 wrote.
fn values8(rho: u32, k: u32) -> array<vec4<f16>, 2> {
    if (!DIRECT) {
        return weight8(rho, k);
    }
    let o = rho * LD + k;
    return array<vec4<f16>, 2>(vec4<f16>(wh[o], wh[o + 1u], wh[o + 2u], wh[o + 3u]),
                               vec4<f16>(wh[o + 4u], wh[o + 5u], wh[o + 6u], wh[o + 7u]));
}

// Two f16 values as one word (exact: f16 -> f32 -> f16; naga has no bitcast of f16 vectors).
fn pack2(h: vec2<f16>) -> u32 {
    return pack2x16float(vec2<f32>(h));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let first = wid.x * OUT_ROWS;
    if (INIT) {
        reader_init(tid);
        workgroupBarrier();
    }
    let nst = params.K / KS;
    for (var st = wid.y * SPW; st < min(nst, wid.y * SPW + SPW); st++) {
        let u = fetch_units(st * KS, tid, first);
        if (DIRECT) {
            for (var n = 0u; n < NU; n++) {
                let k = tid + n * WG;
                if (k < BN * UNITS) {
                    unit_f16(u[n], staged_row(k / UNITS, first).y, st * KS, k % UNITS, k / UNITS);
                }
            }
        } else {
            put_units(u, st * KS, tid, first);
        }
        workgroupBarrier();
        for (var n = 0u; n < BN * KS / 8u / WG; n++) {
            let i = tid + n * WG;
            let rho = i / (KS / 8u);
            let k = 8u * (i % (KS / 8u));
            let v = values8(rho, k);
            w16[(f16_row(rho, first) * params.K + st * KS + k) / 8u] =
                vec4<u32>(pack2(v[0].xy), pack2(v[0].zw), pack2(v[1].xy), pack2(v[1].zw));
        }
        workgroupBarrier();
    }
}
