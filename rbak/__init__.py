"""rbak: RabbitMQ backups in the RBAK segment format.

Core first: this package knows nothing of Kubernetes or Spark. The operator
(``operator/rbak_operator``) and the Spark jobs (``spark/``) are thin layers
over it.
"""

__version__ = "0.1.0"
