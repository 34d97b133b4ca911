"""The run database (SQLAlchemy: SQLite or PostgreSQL): runs and their queue, API tokens,
webhooks, the metrics sinks' cursors, monitoring queries and the migrations
(docs/design/runs.md, "Runs")."""
