// The rounded rows (quantize_q8.wgsl's layout) as f16 values d q in natural order, [token][K]: the
// token tile gemm_mma.wgsl copies (XCOPY: by subgroup matrix loads and stores, or with XVEC by vec4
// words) instead of turning q8 lanes into f16 in every workgroup of a column. The same product d * f32(q) rounded to f16 as
// gemm_mma's own conversion, so either way gives the same bits.
//
// Vec4 j of a row's q bytes holds values 64 (j / 4) + 32 (j % 2) + 16 ((j % 4) / 2) .. +16 (the
// permutation quantize_q8.wgsl describes, seen 64 values at a time); its scale is d_a (j even) or
// d_b of the group's vec4 (d_a, s_a, d_b, s_b) after the K / 16 vec4 of q. Rows T .. rows - 1
// (the last token tile's padding) copy row T - 1. One invocation per vec4; dispatch
// (ceil(K / 16 / 256), rows, 1).

struct Params {
    K: u32,
    T: u32,
    rows: u32,      // rows written: T rounded up to the GEMM's token tile
    x_stride: u32,  // vec4 between tokens of xq (5K / 64)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> x16: array<vec4<u32>>;  // 8 f16 per vec4

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let j = wid.x * 256u + tid;
    if (wid.y >= params.rows || j >= params.K / 16u) {
        return;
    }
    let t = min(wid.y, params.T - 1u);
    let q = xq[t * params.x_stride + j];
    let s = bitcast<vec4<f32>>(xq[t * params.x_stride + params.K / 16u + j / 4u]);
    let d = vec4<f32>(select(s.x, s.z, j % 2u == 1u));
    let o = (wid.y * params.K + 64u * (j / 4u) + 32u * (j % 2u) + 16u * ((j % 4u) / 2u)) / 8u;
    var h: array<vec2<u32>, 4>;
    for (var c = 0u; c < 4u; c++) {
        h[c] = bitcast<vec2<u32>>(vec4<f16>(d * vec4<f32>(unpack4xI8(q[c]))));
    }
    x16[o] = vec4<u32>(h[0], h[1]);
    x16[o + 1u] = vec4<u32>(h[2], h[3]);
}
