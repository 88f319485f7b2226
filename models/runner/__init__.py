"""Forward passes: the model runner, the fused decoder, threads and CPUs, GPU figures, the echo model."""
