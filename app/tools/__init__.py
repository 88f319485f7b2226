"""Tool calls: tool_choice into a grammar, and each model family's call format read back, whole or streamed."""
