"""Reading run records into reports: statistics, aggregation, tables, plots, the plain-language reading."""
