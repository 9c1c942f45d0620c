"""What the router learns from its own traffic: the proxied requests it answered, the outcomes sent back for them,
the feedback sources, the drift test on those outcomes, and the corrections routing takes from them."""
