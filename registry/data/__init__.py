"""What the registry stores and reads back as rows: input files staged and imported, splits, vector files, route
files, current evaluations, the onboarding outbox, availability, endpoints, and the query cache."""
