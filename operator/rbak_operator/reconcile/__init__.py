"""One pass per kind (RabbitMQBackup, RabbitMQRestore): read what is observable, call the pure decisions, apply them."""
