"""The HTTP server's plumbing around the routes: the checks in front of every request, the deadlines of the proxy's
upstream connections, and the listener that closes connections which never send a request."""
