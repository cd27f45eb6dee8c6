// f32 -> f16 with round-to-nearest-even, in integer arithmetic: numpy's astype(float16), which the
// CPU reference uses for the KV cache, q and the attention probabilities. pack2x16float leaves the
// rounding to the implementation (WGSL and SPIR-V both), so it cannot be the one both tiers share.
// |v| >= 65520 becomes inf, as in numpy.

fn f16_bits(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7FFFFFFFu;
    if (a >= 0x477FF000u) {  // rounds past 65504 (or inf / nan)
        return sign | select(0x7C00u, 0x7E00u, a > 0x7F800000u);
    }
    if (a < 0x38800000u) {  // below 2^-14: f16 subnormals, multiples of 2^-24 (exact: a * 2^24 < 1024)
        return sign | u32(round(bitcast<f32>(a) * 16777216.0));  // round() ties to even
    }
    let r = a + 0x0FFFu + ((a >> 13u) & 1u);  // drop 13 mantissa bits, ties to even (a carry bumps the exponent)
    return sign | ((r - 0x38000000u) >> 13u);  // exponent bias 127 -> 15
}

// Two f16 in one word, element 0 in the low half (as little-endian f16 arrays lie).
fn pack_f16(a: f32, b: f32) -> u32 {
    return f16_bits(a) | (f16_bits(b) << 16u);
}
