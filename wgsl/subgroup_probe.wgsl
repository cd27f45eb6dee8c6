// Writes the adapter's subgroup size: wgpu-py does not report it, and kernels
// that use subgroup operations are specialised for it.

@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(subgroup_size) size: u32) {
    if (tid == 0u) {
        out[0] = size;
    }
}
