// Dense weights in the kernels that stage the block readers (mmq_reader.wgsl's staged_row):
// rows start at byte 0 of the binding.

fn expert_byte(slot: u32) -> u32 {
    return 0u;
}
