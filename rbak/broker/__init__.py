"""Talking to RabbitMQ below the engines: the fast AMQP 0-9-1 consume path, the stream readers and the
Management API client (``management``).

Backup and restore both use these (a restore resumes a stream where it ends), so they live here,
below both, and neither engine imports the other.
"""
