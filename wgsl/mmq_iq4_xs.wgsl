// IQ4_XS for gemm_mmq.wgsl: 256 values, 136 bytes (blocks 8-byte aligned) =
// f16 d, 2 bytes scales_h, 4 bytes scales_l, 128 bytes of nibbles; sub-block
// s (32 values) has the 6-bit scale ls = (nibble s of scales_l) | (bits 2s,
// 2s + 1 of scales_h) << 4 and bytes [16s, 16s + 16) of nibbles laid out as
// Q4_0's; v = d (ls - 32) table[q] (mmq_iq4.wgsl). A staging unit is one
// sub-block (units per stage: SUB): the header's 2 words and 4 of nibbles.
// #include mmq_iq4

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = true;

struct Raw {
    hd: vec2<u32>,  // d | scales_h << 16, scales_l
    q: vec4<u32>,
}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let i = (rb + (k0 / 256u) * 136u) >> 2u;
    let s = (k0 % 256u) / 32u + u;
    let o = i + 2u + 4u * s;
    return Raw(vec2<u32>(wword(slot, i), wword(slot, i + 1u)),
               vec4<u32>(wword(slot, o), wword(slot, o + 1u), wword(slot, o + 2u), wword(slot, o + 3u)));
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let s = (k0 % 256u) / 32u + u;
    let a = iq4_word(g.q.x);
    let b = iq4_word(g.q.y);
    let c = iq4_word(g.q.z);
    let e = iq4_word(g.q.w);
    put_q(buf, rho, qv(u, 0u), vec4<u32>(a.x, b.x, c.x, e.x));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(a.y, b.y, c.y, e.y));
    let ls = ((g.hd.y >> (4u * s)) & 0xFu) | (((g.hd.x >> (16u + 2u * s)) & 3u) << 4u);
    put_s(buf, rho, u, vec2<f32>(unpack2x16float(g.hd.x).x * (f32(ls) - 32.0), 0.0));
}
