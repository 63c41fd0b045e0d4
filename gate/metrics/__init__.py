"""The catalogue of metrics a rule can bind to (catalogue): each metric declared once with its dimension,
sampling, pooling and direction.
"""
