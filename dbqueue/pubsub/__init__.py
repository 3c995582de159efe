"""Internal: pub/sub's tables and deliveries: the subscriptions table's statements, the
Subscription value, and webhook deliveries (an HTTP call per delivery)."""
