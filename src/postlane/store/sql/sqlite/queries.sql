-- The sqlite engine's queries, by name (postlane.store.queries). Fragments written
-- {{name}} come from postlane.store.machine.

-- name: schema_version
SELECT max(version) FROM postlane_migrations
