"""Loading targets and drafts, fingerprints and tokenizer compatibility."""
