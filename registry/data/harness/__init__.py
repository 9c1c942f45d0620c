"""Per-sample results straight from evaluation harnesses' logs (Inspect AI, lm-evaluation-harness), turned into the
queries and evaluations the registry's import takes."""
