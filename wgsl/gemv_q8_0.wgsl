// gemv.wgsl's Q8_0 reader (x family "b32"): part p reads block p of the
// chunk, 34 bytes = f16 d and 32 int8, that start at any even byte: the 32
// bytes come from three aligned vec4 and realign.

fn dot_q8_0(slot: u32, rb: u32, bc: u32, p: u32, x: XL) -> f32 {
    let b = rb + bc * 272u + 34u * p;
    let i = (b + 2u) >> 4u;
    let s = (b + 2u) & 15u;
    let v1 = wvec(slot, i + 1u);
    let qa = realign(wvec(slot, i), v1, s);
    let qb = realign(v1, wvec(slot, i + 2u), s);
    return wf16(slot, b) * x.sa.x * f32(dot16(qa, x.a) + dot16(qb, x.b));
}
