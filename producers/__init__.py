"""Producers: poll devices through protocol plugins and publish their readings to Kafka."""
