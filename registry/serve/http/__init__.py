"""The HTTP server's plumbing around the routes: what its OpenAPI document promises (and the shapes it names), and
the checks in front of every request."""
