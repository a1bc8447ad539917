"""The paged KV cache's bookkeeping: blocks, reference counts, prefix cache."""
