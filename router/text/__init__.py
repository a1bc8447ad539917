"""Text in the router: tokenizer, chat template, incremental detokenizing, stop strings."""
