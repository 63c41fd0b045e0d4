"""Serving engines (vLLM, SGLang, TensorRT-LLM, llama.cpp, generic): one module per engine
dialect, each saying which /metrics counters are its spec-decode counters, how the declared
law and a constraint go on the wire, and what it cannot apply as gate does
(gate.runners.engines.interface.Engine); looked up by name in gate.runners.engines.registry."""
