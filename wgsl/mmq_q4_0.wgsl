// Q4_0 for gemm_mmq.wgsl: 32 values, 18 bytes (blocks 2-byte aligned) = f16 d,
// 16 bytes of nibbles: value j < 16 is the low nibble of byte j, j >= 16 the
// high nibble of byte j - 16; v = d (q - 8), and q - 8 fits int8. A staging
// unit is one block (units per stage: SUB), read as the 5 words holding it.

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: array<u32, 5>,
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let i = (rb + (k0 / 32u + u) * 18u) >> 2u;
    var g: Raw;
    for (var k = 0u; k < 5u; k++) {
        g.q[k] = wword(slot, i + k);
    }
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let odd = ((rb + (k0 / 32u + u) * 18u) & 2u) != 0u;
    var lo: array<u32, 4>;
    var hi: array<u32, 4>;
    for (var k = 0u; k < 4u; k++) {
        let q = select(al16(g.q[k], g.q[k + 1u], true), g.q[k + 1u], odd);
        lo[k] = minus4(q & LO4, 0x08080808u);
        hi[k] = minus4((q >> 4u) & LO4, 0x08080808u);
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(lo[0], lo[1], lo[2], lo[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(hi[0], hi[1], hi[2], hi[3]));
    put_s(buf, rho, u, vec2<f32>(half_at(g.q[0], odd), 0.0));
}
