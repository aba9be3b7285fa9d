"""Contracts only: the event schema and the reason codes. Importing needs no SparkSession."""
