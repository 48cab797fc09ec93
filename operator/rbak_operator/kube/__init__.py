"""The Kubernetes API: the operator's client, broker credentials from Secrets, events, and the calls it may make (RBAC)."""
