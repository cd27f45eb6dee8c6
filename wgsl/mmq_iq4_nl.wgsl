// IQ4_NL for gemm_mmq.wgsl: 32 values, 18 bytes (blocks 2-byte aligned) = f16
// d, 16 bytes of nibbles laid out as Q4_0's; v = d table[q] (mmq_iq4.wgsl's
// int8 code book). A staging unit is one block (units per stage: SUB), read
// as the 5 words holding it.
// #include mmq_iq4

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = true;

struct Raw {
    q: array<u32, 5>,
}

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
        let v = iq4_word(select(al16(g.q[k], g.q[k + 1u], true), g.q[k + 1u], odd));
        lo[k] = v.x;
        hi[k] = v.y;
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(lo[0], lo[1], lo[2], lo[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(hi[0], hi[1], hi[2], hi[3]));
    put_s(buf, rho, u, vec2<f32>(half_at(g.q[0], odd), 0.0));
}
