// gemv.wgsl's IQ4_NL reader (x family "b32"): part p reads block p of the
// chunk, 18 bytes = f16 d and 16 bytes of nibbles laid out as Q4_0, each
// indexing ggml's kvalues_iq4nl (int8, so the looked-up bytes go to
// dot4I8Packed). The table sits in workgroup memory: a nibble's entry is one
// load from a bank of its own, where a const array indexed per lane would
// serialise or spill.

const IQ4_KVALUES: array<i32, 16> = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

var<workgroup> iq4_tab: array<u32, 16>;

// Called by every invocation first (it holds a barrier).
fn iq4_init(tid: u32) {
    if (tid < 16u) {
        iq4_tab[tid] = u32(IQ4_KVALUES[tid]) & 0xFFu;
    }
    workgroupBarrier();
}

// Table bytes of the nibbles at `shift` (0 low, 4 high) of four words.
fn iq4_bytes(q: vec4<u32>, shift: u32) -> vec4<u32> {
    var out: vec4<u32>;
    for (var k = 0u; k < 4u; k++) {
        let v = q[k] >> shift;
        out[k] = iq4_tab[v & 0xFu] | (iq4_tab[(v >> 8u) & 0xFu] << 8u) | (iq4_tab[(v >> 16u) & 0xFu] << 16u)
               | (iq4_tab[(v >> 24u) & 0xFu] << 24u);
    }
    return out;
}

fn w_iq4_nl(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 144u + 18u * p;
    let q = wide16(slot, b + 2u);
    let d = wf16(slot, b);
    return WB(iq4_bytes(q, 0u), iq4_bytes(q, 4u), vec4<f32>(d, d, 0.0, 0.0));
}
