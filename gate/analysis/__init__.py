"""What summarises a run without deciding anything: the summary table, load points and crossovers, interactivity,
the num_draft_tokens schedule. Rules decide; these describe.
"""
