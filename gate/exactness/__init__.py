"""Whether speculative sampling reproduces the target's declared law: the target oracle that scores tokens by
teacher forcing, the passes that gather the raw material (greedy against the fallback, sampled from served
engines), the collection of divergences, PIT values and next-token counts, the statistical tests with their
power, and the verdict.
"""
