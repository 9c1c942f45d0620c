"""What the registry stores and reads back as rows: input files read (input_files) and imported (import_*), splits,
vector and route files, current evaluations, the onboarding outbox, availability, endpoints, the query cache."""
