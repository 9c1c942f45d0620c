"""Ways to run the text encoder other than sentence-transformers on torch: all-MiniLM-L6-v2 exported once to ONNX and
run by ONNX Runtime (no torch on the request path)."""
