// gemv.wgsl's Q4_0 reader (x family "b32"): part p reads block p of the
// chunk, 18 bytes = f16 d and 16 bytes of nibbles (low: values 0..15, high:
// 16..31), from any even byte. v = d (q - 8), so the block's sum is
// d (dx sum q qx - 8 dx sum qx).

fn dot_q4_0(slot: u32, rb: u32, bc: u32, p: u32, x: XL) -> f32 {
    let b = rb + bc * 144u + 18u * p;
    let q = wide16(slot, b + 2u);
    let i = dot16(q & vec4<u32>(LO), x.a) + dot16((q >> vec4<u32>(4u)) & vec4<u32>(LO), x.b);
    return wf16(slot, b) * (x.sa.x * f32(i) - 8.0 * x.sa.y);
}
