// Q4_1 for gemm_mmq.wgsl: 32 values, 20 bytes (blocks 4-byte aligned) = f16 d,
// f16 m, 16 bytes of nibbles laid out as Q4_0's; v = d q + m (MIN_TERM). A
// staging unit is one block (units per stage: SUB), 5 words.

const UNITS: u32 = SUB;
const MIN_TERM: bool = true;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: array<u32, 5>,
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let i = (rb + (k0 / 32u + u) * 20u) >> 2u;
    var g: Raw;
    for (var k = 0u; k < 5u; k++) {
        g.q[k] = wword(slot, i + k);
    }
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let q = vec4<u32>(g.q[1], g.q[2], g.q[3], g.q[4]);
    put_q(buf, rho, qv(u, 0u), q & vec4<u32>(LO4));
    put_q(buf, rho, qv(u, 1u), (q >> vec4<u32>(4u)) & vec4<u32>(LO4));
    put_s(buf, rho, u, unpack2x16float(g.q[0]));
}
