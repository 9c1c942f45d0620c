"""The HTTP server's plumbing around the routes: the checks in front of every request, what its OpenAPI document
promises, the deadlines of the proxy's upstream connections, and the listener that closes silent connections."""
