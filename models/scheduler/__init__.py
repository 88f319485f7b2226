"""Which sequences run each step and in which slot: the queue, fair shares, deadlines, sequences."""
