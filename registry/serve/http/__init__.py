"""What keeps `registry serve` safe on a network: the guards every request passes, the deadlines of the proxy's
upstream connections, and the listener that closes connections which never send a request."""
