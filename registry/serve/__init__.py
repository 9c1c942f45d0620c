"""`registry serve`: the HTTP app (one router per area), the web pages, the OpenAI-compatible proxy, the single
writer, the in-memory snapshot reads answer from, and the answer book."""
