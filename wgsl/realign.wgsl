// Bytes s .. s + 16 of lo|hi (s even): 16 bytes at any even offset from two
// aligned loads, by word and half-word selects (no dynamic register indexing).
fn realign(lo: vec4<u32>, hi: vec4<u32>, s: u32) -> vec4<u32> {
    let by8 = (s & 8u) != 0u;
    let a = select(lo, vec4<u32>(lo.zw, hi.xy), by8);
    let b = select(hi.xy, hi.zw, by8);
    let by4 = (s & 4u) != 0u;
    let a1 = select(a, vec4<u32>(a.yzw, b.x), by4);
    let n = vec4<u32>(a1.yzw, select(b.x, b.y, by4));
    return select(a1, (a1 >> vec4<u32>(16u)) | (n << vec4<u32>(16u)), (s & 2u) != 0u);
}
