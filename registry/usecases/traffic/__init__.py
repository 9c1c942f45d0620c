"""The operations on the router's own traffic (usecases/ is full, so they have a wing of their own): outcomes in,
the re-embedding they call for, feedback sources, drift events."""
