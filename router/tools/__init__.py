"""Tool calling on chat: tool definitions, tool_choice as a grammar, parsers of the
model's own tool-call syntax, and the streamed message deltas they make."""
