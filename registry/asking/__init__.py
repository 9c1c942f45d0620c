"""Asking endpoints ourselves: `registry ask` (a versioned prompt, grading, an API client, the run that stores what it
says), and the endpoints that claim a model with the tests behind `registry verify` and `registry watch`."""
