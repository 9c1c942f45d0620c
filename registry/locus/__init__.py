"""The LOCUS method with no database: the text encoder, the set encoder and predictor network, checkpoints,
training, the interaction terms, the baselines it is compared with, and probe design."""
