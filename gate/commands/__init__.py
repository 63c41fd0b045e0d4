"""The commands behind the CLI, as functions: check, merge, compare, exactness (recorded samples), bill and
roofline.
"""
