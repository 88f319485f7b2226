"""Faster nn.Linear layers swapped in at load: packed float32, int8, block int8 and its C kernel."""
