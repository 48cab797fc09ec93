"""Restore drills: a backup's (``backup``) and a continuous archive's (``archive``), proven in a scratch vhost."""
