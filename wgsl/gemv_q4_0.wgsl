// gemv.wgsl's Q4_0 reader (x family "b32"): part p reads block p of the
// chunk, 18 bytes = f16 d and 16 bytes of nibbles (low: values 0..15, high:
// 16..31), from any even byte. v = d (q - 8), so the block's sum is
// d (dx sum q qx - 8 dx sum qx).

fn w_q4_0(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 144u + 18u * p;
    let q = wide16(slot, b + 2u);
    let d = wf16(slot, b);
    return WB(q & vec4<u32>(LO), (q >> vec4<u32>(4u)) & vec4<u32>(LO), vec4<f32>(d, d, -8.0 * d, 0.0));
}
