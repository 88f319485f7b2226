"""From logits to text: sampling parameters, the sampler, stop strings, the detokenizer."""
