"""Constrained decoding: grammars compiled by xgrammar mask each step's logits."""
