-- Postlane 0003: versioned templates and bulk-import runs.
-- A template is a name plus immutable versions; editing adds a version. Deliveries keep
-- the rendered content with (template_id = name, template_version), so a template is never
-- needed again to send, retry or replay; it is kept while deliveries may still do so.
CREATE TABLE postlane_templates (
    name           TEXT PRIMARY KEY,
    latest_version INTEGER NOT NULL CHECK (latest_version >= 1),
    deprecated_at  TIMESTAMPTZ,
    deleted_at     TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE postlane_template_versions (
    name       TEXT NOT NULL REFERENCES postlane_templates (name) ON DELETE CASCADE,
    version    INTEGER NOT NULL CHECK (version >= 1),
    subject    TEXT NOT NULL,
    text_body  TEXT,
    html_body  TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- "Is this template still referenced?" touches only templated rows.
CREATE INDEX postlane_deliveries_template ON postlane_deliveries (template_id)
    WHERE template_id IS NOT NULL;

-- One row per import id; a re-run (or a resume after a crash) updates it.
CREATE TABLE postlane_imports (
    import_id        TEXT PRIMARY KEY,
    template         TEXT NOT NULL,
    template_version INTEGER NOT NULL,
    file_name        TEXT NOT NULL,
    lane             TEXT NOT NULL,
    runs             INTEGER NOT NULL DEFAULT 1,
    started_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ,
    rows_read        BIGINT NOT NULL DEFAULT 0,
    rows_enqueued    BIGINT NOT NULL DEFAULT 0,
    rows_created     BIGINT NOT NULL DEFAULT 0,
    rows_skipped     BIGINT NOT NULL DEFAULT 0,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
