// BF16 weights: the top 16 bits of an f32. A "block" is 8 values (16 bytes),
// 16-byte aligned when K % 8 == 0.
// #include quant_common

const QK: u32 = 8u;
const BLOCK_BYTES: u32 = 16u;

fn bf16_pair(q: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(q << 16u, q & 0xFFFF0000u));
}

fn block_dot(wb: u32, xo: u32) -> f32 {
    let i = wb >> 2u;
    let a = vec4<f32>(bf16_pair(w[i]), bf16_pair(w[i + 1u]));
    let b = vec4<f32>(bf16_pair(w[i + 2u]), bf16_pair(w[i + 3u]));
    return dot(a, x4(xo)) + dot(b, x4(xo + 4u));
}

fn block_value(wb: u32, i: u32) -> f32 {
    return bitcast<f32>(rd_u16(wb + 2u * i) << 16u);
}

// Values i .. i+3 of the block (i % 4 == 0), for kernels that stage whole tiles (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let j = (wb >> 2u) + (i >> 1u);
    return vec4<f32>(bf16_pair(w[j]), bf16_pair(w[j + 1u]));
}
