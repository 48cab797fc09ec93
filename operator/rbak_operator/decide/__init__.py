"""Pure decisions of the operator: no API call, no storage, no clock of its own (tested without a server)."""
