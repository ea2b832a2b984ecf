-- Postlane 0003: versioned templates and bulk-import runs. Times are REAL unix seconds.
-- A template is a name plus immutable versions; editing adds a version. Deliveries keep
-- the rendered content with (template_id = name, template_version), so a template is never
-- needed again to send, retry or replay; it is kept while deliveries may still do so.
CREATE TABLE postlane_templates (
    name           TEXT PRIMARY KEY,
    latest_version INTEGER NOT NULL CHECK (latest_version >= 1),
    deprecated_at  REAL,
    deleted_at     REAL,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL
);

CREATE TABLE postlane_template_versions (
    name       TEXT NOT NULL REFERENCES postlane_templates (name) ON DELETE CASCADE,
    version    INTEGER NOT NULL CHECK (version >= 1),
    subject    TEXT NOT NULL,
    text_body  TEXT,
    html_body  TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE INDEX postlane_deliveries_template ON postlane_deliveries (template_id)
    WHERE template_id IS NOT NULL;

CREATE TABLE postlane_imports (
    import_id        TEXT PRIMARY KEY,
    template         TEXT NOT NULL,
    template_version INTEGER NOT NULL,
    file_name        TEXT NOT NULL,
    lane             TEXT NOT NULL,
    runs             INTEGER NOT NULL DEFAULT 1,
    started_at       REAL NOT NULL,
    last_started_at  REAL NOT NULL,
    finished_at      REAL,
    rows_read        INTEGER NOT NULL DEFAULT 0,
    rows_enqueued    INTEGER NOT NULL DEFAULT 0,
    rows_created     INTEGER NOT NULL DEFAULT 0,
    rows_skipped     INTEGER NOT NULL DEFAULT 0,
    updated_at       REAL NOT NULL
);
