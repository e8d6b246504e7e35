"""The API's infrastructure: settings, the ClickHouse and Kafka clients, authentication,
errors, request parameters and limits, serving and streaming. Nothing here knows a route,
a query or the domain (jobs, readings, visibility)."""
