// Where rounded values lie in a token's 8-bit row (quantize_q8.wgsl's layout), for the kernels that
// write one (q8_common.wgsl, gemv_q8_on.wgsl): the row starts at word `row` and holds `width` values.

// The word of values v .. v + 3 (v % 4 == 0).
fn q8_word_at(row: u32, v: u32) -> u32 {
    let r = v % 256u;
    let c = r / 64u;
    let hi = (r % 64u) / 32u;
    let i = r % 32u;
    let p = 2u * c + i / 16u;
    return row + (v / 256u) * 64u + (p * 32u + hi * 16u + i % 16u) / 4u;
}

// The (d, d * sum q) pair of value v's 32-value sub-block: block v / 256, pair c, sub-block `hi` of the pair.
fn q8_scale_at(row: u32, width: u32, v: u32) -> u32 {
    let r = v % 256u;
    return row + width / 4u + ((v / 256u) * 4u + r / 64u) * 4u + 2u * ((r % 64u) / 32u);
}

// Four rounded values as one word, value v in the low byte.
fn q8_word(q: vec4<i32>) -> u32 {
    return (u32(q.x) & 0xFFu) | ((u32(q.y) & 0xFFu) << 8u) | ((u32(q.z) & 0xFFu) << 16u) | ((u32(q.w) & 0xFFu) << 24u);
}
