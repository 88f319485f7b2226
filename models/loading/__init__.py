"""Models from disk or the hub: the loader, the tokenizer, control tokens, the embedded tiny model."""
