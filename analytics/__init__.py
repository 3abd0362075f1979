"""Failure-mode analytics: a DuckDB warehouse fed from the event store, named queries, reports.

Entry points: `analytics.sync.sync` (store -> warehouse), `analytics.service` (what the CLI and the
HTTP API call), `analytics.report` (text, Markdown, HTML with inline SVG charts), `analytics.export`
(Parquet partitioned by task family). See docs/analytics.md.
"""
