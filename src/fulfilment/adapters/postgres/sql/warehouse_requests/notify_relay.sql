SELECT pg_notify('fulfilment_outbox', '')
