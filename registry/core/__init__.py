"""The store underneath everything: the database engine and its two dialects, the schema and its migrations, one
managed transaction per operation, the registry's error types, settings, whole-database copies."""
