"""What the registry answers about models: the catalog, neighbours, version history, geometry, fingerprints,
portfolios, fallbacks, maps, registration reports and probe plans."""
