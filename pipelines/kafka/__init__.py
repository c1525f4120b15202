"""Kafka: the development broker (`seclake kafka start|stop|status`)."""
