"""Rule evaluation over measurement records: samples, aggregation, comparison, outcomes."""
