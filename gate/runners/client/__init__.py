"""gate's streaming HTTP client of a serving engine: the protocols it speaks (protocol),
one connection per request in flight (pool), SSE lines (sse), stream chunks (parse), one
request's stream read into a StreamResult (stream), and how a transport failure is named
(transport). It knows no engine: what goes in a request body beyond the protocol's own
fields is the caller's (gate.runners.openai with gate.runners.engines)."""
