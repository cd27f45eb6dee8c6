// Q4_0 for gemm_mmq.wgsl: 32 values, 18 bytes (blocks 2-byte aligned) = f16 d,
// 16 bytes of nibbles: value j < 16 is the low nibble of byte j, j >= 16 the
// high nibble of byte j - 16; v = d (q - 8), and q - 8 fits int8. A staging
// unit is one block (units per stage: SUB): its 16 bytes of nibbles from the two
// aligned vec4 holding them (realign) and the word holding d, three loads.
// #include realign

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    v: array<vec4<u32>, 2>,  // the aligned vec4 holding the nibbles
    d: u32,                  // the word holding d
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let b = rb + (k0 / 32u + u) * 18u;
    let i = (b + 2u) >> 4u;
    return Raw(array<vec4<u32>, 2>(wvec(slot, i), wvec(slot, i + 1u)), wword(slot, b >> 2u));
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let b = rb + (k0 / 32u + u) * 18u;
    let q = realign(g.v[0], g.v[1], (b + 2u) & 15u);
    var lo: array<u32, 4>;
    var hi: array<u32, 4>;
    for (var k = 0u; k < 4u; k++) {
        lo[k] = minus4(q[k] & LO4, 0x08080808u);
        hi[k] = minus4((q[k] >> 4u) & LO4, 0x08080808u);
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(lo[0], lo[1], lo[2], lo[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(hi[0], hi[1], hi[2], hi[3]));
    put_s(buf, rho, u, vec2<f32>(half_at(g.d, (b & 2u) != 0u), 0.0));
}
