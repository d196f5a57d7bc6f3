"""gateway: the HTTP edge — webhooks in, operator API and console."""
