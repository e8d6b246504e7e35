"""What every jobscope Kafka client shares (the broker's own files sit beside it)."""
