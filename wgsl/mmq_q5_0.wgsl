// Q5_0 for gemm_mmq.wgsl: 32 values, 22 bytes (blocks 2-byte aligned) = f16 d,
// 4 bytes qh, 16 bytes of nibbles laid out as Q4_0's; bit j of qh is the fifth
// bit of value j; v = d (q - 16), and q - 16 fits int8. A staging unit is one
// block (units per stage: SUB): qh and the nibbles, 20 bytes, from the three
// aligned vec4 holding them (realign, as the GEMV's reader), and the word
// holding d: four loads where words took six.
// #include realign

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    v: array<vec4<u32>, 3>,  // the aligned vec4 holding qh and the nibbles
    d: u32,                  // the word holding d
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let b = rb + (k0 / 32u + u) * 22u;
    let i = (b + 2u) >> 4u;
    return Raw(array<vec4<u32>, 3>(wvec(slot, i), wvec(slot, i + 1u), wvec(slot, i + 2u)), wword(slot, b >> 2u));
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let b = rb + (k0 / 32u + u) * 22u;
    let r0 = realign(g.v[0], g.v[1], (b + 2u) & 15u);  // qh, nibble bytes 0..11
    let r1 = realign(g.v[1], g.v[2], (b + 2u) & 15u);  // nibble bytes 12..15, ...
    let qh = r0.x;
    let nib = vec4<u32>(r0.yzw, r1.x);
    var lo: array<u32, 4>;
    var hi: array<u32, 4>;
    for (var k = 0u; k < 4u; k++) {
        let q = nib[k];
        lo[k] = minus4((q & LO4) | (spread4(qh >> (4u * k)) << 4u), 0x10101010u);
        hi[k] = minus4(((q >> 4u) & LO4) | (spread4(qh >> (16u + 4u * k)) << 4u), 0x10101010u);
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(lo[0], lo[1], lo[2], lo[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(hi[0], hi[1], hi[2], hi[3]));
    put_s(buf, rho, u, vec2<f32>(half_at(g.d, (b & 2u) != 0u), 0.0));
}
