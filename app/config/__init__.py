"""Every serve option, and the one frozen Settings built from flags and SURGE_* variables."""
