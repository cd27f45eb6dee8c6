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
const WQN: u32 = XV * BN;
const WSN: u32 = SUB * BN;

@group(0) @binding(13) var<storage, read_write> w16: array<vec4<u32>>;  // 8 f16 per vec4
var<workgroup> partial: array<f32, 1>;  // matmul_common's finish_row needs the name; unused here

// #include mma_stage

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
        put_units(fetch_units(st * KS, tid, first), st * KS, tid, first);
        workgroupBarrier();
        for (var n = 0u; n < BN * KS / 8u / WG; n++) {
            let i = tid + n * WG;
            let rho = i / (KS / 8u);
            let k = 8u * (i % (KS / 8u));
            let v = weight8(rho, k);
            w16[(f16_row(rho, first) * params.K + st * KS + k) / 8u] =
                vec4<u32>(pack2(v[0].xy), pack2(v[0].zw), pack2(v[1].xy), pack2(v[1].zw));
        }
        workgroupBarrier();
    }
}
