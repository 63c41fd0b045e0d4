"""The primitives every layer may import: the declared sampling law, the speculative verification step, units,
errors, the registry type, what a runner is asked to run and the descriptive quantile.
"""
