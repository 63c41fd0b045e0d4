"""Offered load: how many requests are in flight and when they are sent, apart from the
runner that serves them (gate.runners). interface (LoadStrategy); one module per strategy:
sequential, closed (a concurrency), open (a request rate, gamma arrivals); schedule (a load
point split over the client's workers); points (the policy's load points, built from the
strategies); search (the envelope search: where to probe next, when a probe holds)."""
