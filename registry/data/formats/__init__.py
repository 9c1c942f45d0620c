"""Every reader of others' files in one wing: the import formats in one table (readers.py; others' by entry point),
harness logs (Inspect AI, lm-evaluation-harness), Every Eval Ever and HELM; EEE's schemas (MIT) ship beside them."""
