"""The commands behind the CLI, as functions: check (gate check and gate validate's
wiring), merge, compare, exactness (recorded samples), bill (gate bill and gate roofline).
"""
