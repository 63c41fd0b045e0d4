"""Offered load: how many requests are in flight and when they are sent, apart from the
runner that serves them (gate.runners). One module per strategy; only `sequential`
exists today (served engines at a concurrency or a request rate come later)."""
