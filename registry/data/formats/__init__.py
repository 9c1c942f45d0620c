"""The import formats as readers in one table (readers.py; others' by entry point), and Every Eval Ever and HELM
read and written here: EEE's schemas (0.3.0, MIT, schemas/LICENSE) ship beside them."""
