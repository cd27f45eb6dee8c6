// gemv.wgsl's Q8_0 reader (x family "b32"): part p reads block p of the
// chunk, 34 bytes = f16 d and 32 int8, that start at any even byte: the 32
// bytes come from three aligned vec4 and realign.

fn w_q8_0(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 272u + 34u * p;
    let i = (b + 2u) >> 4u;
    let s = (b + 2u) & 15u;
    let v1 = wvec(slot, i + 1u);
    let qa = realign(wvec(slot, i), v1, s);
    let qb = realign(v1, wvec(slot, i + 2u), s);
    let d = wf16(slot, b);
    return WB(qa, qb, vec4<f32>(d, d, 0.0, 0.0));
}
