"""From evaluations to model embeddings: installed encoders, the masked forward pass over evaluation sets, the
dataset matrix, versions written by onboarding, the FAISS index, and the evidence behind each embedding."""

MIN_EVALUATIONS = 32   # the fewest evaluations a model is embedded from

