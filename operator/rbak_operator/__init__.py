"""rbak's Kubernetes operator: RabbitMQBackup / RabbitMQRestore over kopf.

Every decision lives in pure modules (``schedule``, ``naming``, ``bodies``,
``rbakconfig``, ``status``, ``policy``) tested without a server; ``handlers``
only reads objects, calls those functions and applies the result.
The package is named ``rbak_operator`` (not ``operator``) so it never shadows
Python's stdlib ``operator`` module.
"""

__version__ = "0.1.0"
