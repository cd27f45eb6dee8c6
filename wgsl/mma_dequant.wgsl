// A weight chunk's rows as f16 values, [row][K], for the tensor-core kernel's WCOPY tiles
// (gemm_mma.wgsl copies its weight tiles from them): each block is turned into values once per
// product, not once per token tile. The same readers and arithmetic (mma_values.wgsl) as
// gemm_mma's own conversion, so either way gives the same bits.
//
// Each invocation turns ITEMS (row, stage) items into f16 values and stores them, from registers:
// no workgroup memory and no barrier. A stage is SUB = 2 sub-blocks, 64 values: the reader's two
// units (every reader has UNITS = SUB), which between them write both sub-blocks' lanes and scale
// terms. (Staging 64 rows a stage at a time in workgroup memory, two barriers a stage, streamed
// about 1.15 TB/s of reads and writes on an H100: perf/h200/profile-8b-pp512-2026-12-06-h100-s36.json.)
// A workgroup covers BN = 64 staged rows (PAIR: 32 of gate, binding 1, and the same 32 of up,
// binding 6) x SPW stages, a row's stages on neighbouring invocations, so its stores are
// contiguous. Rows are padded to 128 per half (mma_values' f16_row); rows past N copy row N - 1.
// Dispatch (ceil(N / OUT_ROWS) rounded up to 128 rows, ceil(K / (KS SPW)), 1).

// #include mmq_expert_none
// #include mmq_reader
// #include mmq_{{QTYPE}}
// #include mma_values

const BN: u32 = 64u;
const SUB: u32 = 2u;
const SPW: u32 = 8u;  // stages per workgroup
const PAIR: bool = {{PAIR}};
const WG: u32 = 256u;
const KS: u32 = 32u * SUB;
const ITEMS: u32 = BN * SPW / WG;  // (row, stage) items per invocation
const OUT_ROWS: u32 = select(BN, BN / 2u, PAIR);
const NU: u32 = 1u;  // sizes mmq_reader's fetch_units (the tiles' staging), which this kernel does not call

@group(0) @binding(13) var<storage, read_write> w16: array<vec4<u32>>;  // 8 f16 per vec4
var<workgroup> partial: array<f32, 1>;  // matmul_common's finish_row needs the name; unused here

// One stage of one row as its reader's put_unit hands it over (quantize_q8's vec4 order, qv).
var<private> lanes: array<vec4<u32>, 2u * SUB>;
var<private> terms: array<vec2<f32>, SUB>;

fn put_q(buf: u32, rho: u32, v: u32, q: vec4<u32>) {
    lanes[v] = q;
}

fn put_s(buf: u32, rho: u32, sl: u32, s: vec2<f32>) {
    terms[sl] = s;
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
    // Every item's loads first, so they are in flight together.
    var raw: array<Raw, 2u * ITEMS>;
    for (var n = 0u; n < ITEMS; n++) {
        let i = tid + n * WG;
        let at = staged_row(i / SPW, first);
        let k0 = min(wid.y * SPW + i % SPW, nst - 1u) * KS;
        raw[2u * n] = fetch_unit(at.x, at.y, k0, 0u);
        raw[2u * n + 1u] = fetch_unit(at.x, at.y, k0, 1u);
    }
    for (var n = 0u; n < ITEMS; n++) {
        let i = tid + n * WG;
        let rho = i / SPW;
        let st = wid.y * SPW + i % SPW;
        if (st < nst) {
            let rb = staged_row(rho, first).y;
            put_unit(raw[2u * n], rb, st * KS, 0u, rho, 0u);
            put_unit(raw[2u * n + 1u], rb, st * KS, 1u, rho, 0u);
            let o = (f16_row(rho, first) * params.K + st * KS) / 8u;
            for (var g = 0u; g < KS / 8u; g++) {
                let sl = g / 4u;
                let v = values8(lanes[qv(sl, g % 4u / 2u)], terms[sl], 8u * g);
                w16[o + g] = vec4<u32>(pack2(v[0].xy), pack2(v[0].zw), pack2(v[1].xy), pack2(v[1].zw));
            }
        }
    }
}
