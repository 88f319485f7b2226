"""What operators read: Prometheus metrics and their own port, logs, memory diagnostics."""
