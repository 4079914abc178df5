"""One durable way to hand work to the broker: a transactional outbox (see services.py)."""
