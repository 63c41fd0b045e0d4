"""gate's streaming HTTP client of a serving engine: the protocols it speaks (protocol),
HTTP/1.1 connections kept alive per worker (wire), a request's bytes moved and stamped
(transfer) by worker processes (worker, workers), SSE lines (sse), stream chunks (parse,
events), one request's stream read into a StreamResult (stream), and how a transport
failure is named (transport). It knows no engine: what goes in a request body beyond the protocol's own
fields is the caller's (gate.runners.openai with gate.runners.engines)."""
