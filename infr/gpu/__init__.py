"""wgpu backend: device, buffer arena, pipeline cache, and the plan executor."""
