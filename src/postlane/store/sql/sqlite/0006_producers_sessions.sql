-- Postlane 0006: a key belongs to its producer. ``producer`` names who wrote the delivery:
-- NULL for the application (outbox, Store.enqueue, CLI), ``apikey:<id>`` for an HTTP API
-- client, ``import:<import id>`` for a bulk import. An enqueue that finds its key held by
-- another producer is refused (KeyConflict) instead of answered with that delivery. Rows
-- from before this migration stay NULL; those with a request_hash were written by the
-- HTTP API and are read as held by an unknown API key (see core/producers.py).
ALTER TABLE postlane_deliveries ADD COLUMN producer TEXT;

-- Signing out of the dashboard ends the key's sessions on the server: a session cookie
-- issued before ``sessions_after`` (unix seconds, the server's clock) is refused. Per key,
-- so that checking it costs nothing: every dashboard request reads the key already.
ALTER TABLE postlane_api_keys ADD COLUMN sessions_after REAL;
