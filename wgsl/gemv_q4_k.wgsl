// gemv.wgsl's Q4_K reader (x family "std"). A Q4_K block is 144 bytes =
// 9 vec4<u32>: [d|dmin, scales0, scales1, scales2] then 8 of nibbles; part p
// = 2c + hh reads nibble vec4 p, 16 low nibbles (values 64c + 16hh .. +16)
// and 16 high (64c + 32 + 16hh ..): the order quantize_q8 put the lane's
// activations in, so
//   sum_i (d sc q_i - dmin m) (dx qx_i) = d sc dx sum_i q_i qx_i - dmin m (dx sum_i qx_i).
// Rows are 16-byte aligned (K % 256 == 0).

// One lane's share of a Q4_K / Q5_K block: header hd, the 32 quants as bytes
// (qa: sub-block 2c, qb: 2c + 1). The 6-bit scales and mins of sub-blocks
// 2c and 2c + 1 (k_scales layout) are decoded as byte pairs, with no branch
// and no dynamic vector index: the first version (bytes6 of every header
// word, then a select per sub-block, the mins in a branch that half the lanes
// took) left the Q4_K GEMV at half of Q4_0's bandwidth on the H200. Only the
// lanes with hh = 0 take the mins' term, which covers whole sub-blocks.
fn k_weights(hd: vec4<u32>, qa: vec4<u32>, qb: vec4<u32>, p: u32) -> WB {
    let dm = unpack2x16float(hd.x);
    let sh = 8u * (p & 2u);      // byte 2 (c) of the pair in its word: c = p / 2, bytes 2c & 3
    let y = hd.y >> sh;          // scales of sub-blocks 0..3 (low 6 bits), high bits of 4..7
    let z = hd.z >> sh;          // mins of 0..3, high bits of 4..7's mins
    let v = hd.w >> sh;          // low 4 bits of 4..7's scales (low nibble) and mins (high)
    let hi = p >= 4u;            // sub-blocks 4..7
    let sc = select(y & 0x3F3Fu, (v & 0x0F0Fu) | ((y >> 2u) & 0x3030u), hi);
    let mn = select(z & 0x3F3Fu, ((v >> 4u) & 0x0F0Fu) | ((z >> 2u) & 0x3030u), hi);
    let take_min = select(0.0, -dm.y, (p & 1u) == 0u);
    return WB(qa, qb, vec4<f32>(dm.x * f32(sc & 0xFFu), dm.x * f32((sc >> 8u) & 0xFFu),
                                take_min * f32(mn & 0xFFu), take_min * f32((mn >> 8u) & 0xFFu)));
}

fn w_q4_k(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let v = rb / 16u + bc * 9u;
    let q = wvec(slot, v + 1u + p);
    return k_weights(wvec(slot, v), q & vec4<u32>(LO), (q >> vec4<u32>(4u)) & vec4<u32>(LO), p);
}
