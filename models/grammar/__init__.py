"""Constrained decoding: JSON Schemas bounded, grammars compiled, one step's token masks."""
