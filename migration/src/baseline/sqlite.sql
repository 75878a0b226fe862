-- The baseline schema of solid-notify on SQLite (ADR 0013): what the 24
-- pre-release migrations built, in one migration. Statements are
-- separated by statement-breakpoint lines; the equivalence test
-- (tests/it/baseline.rs) checks it against the old chain's schema.

CREATE TABLE "notify_def" (
    "id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "name" varchar(191) NOT NULL UNIQUE,
    "channel" varchar(32) NOT NULL,
    "target" text NOT NULL,
    "retry_interval" varchar(255) NOT NULL,
    "max_retry_times" integer NOT NULL,
    "max_retry_interval" integer NOT NULL,
    "alert_trigger_type" smallint NOT NULL,
    "alert_trigger_fail_times" integer NOT NULL,
    "email" text NOT NULL DEFAULT '',
    "need_confirm" boolean NOT NULL DEFAULT FALSE,
    "max_confirm_delay" integer NOT NULL DEFAULT 0,
    "description" text NOT NULL DEFAULT '',
    "create_time" datetime_text NOT NULL DEFAULT (CURRENT_TIMESTAMP),
    "update_time" datetime_text NOT NULL DEFAULT (CURRENT_TIMESTAMP),
    "paused_until" datetime_text NULL,
    "pause_reason" text NULL,
    "circuit_failures" integer NOT NULL DEFAULT 0,
    "circuit_window" integer NOT NULL DEFAULT 60,
    "circuit_cool_down" integer NOT NULL DEFAULT 300,
    "on_error" varchar(16) NOT NULL DEFAULT 'retry',
    "immediate_retries" integer NOT NULL DEFAULT 0,
    "immediate_retry_delay" integer NOT NULL DEFAULT 100,
    "retry_jitter" smallint NOT NULL DEFAULT 0,
    "rate_limit" varchar(32) NOT NULL DEFAULT '',
    "ordering" varchar(16) NOT NULL DEFAULT '',
    "stop_on_failure" boolean NOT NULL DEFAULT TRUE,
    "steps" text NOT NULL DEFAULT '',
    "events_to" varchar(191) NOT NULL DEFAULT '',
    "encrypt" boolean NOT NULL DEFAULT FALSE
)

--> statement-breakpoint

CREATE TABLE "notify_msg" (
    "id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "def_id" integer NOT NULL,
    "param" text NOT NULL,
    "description" text NOT NULL DEFAULT '',
    "errors" text NOT NULL DEFAULT '',
    "status" smallint NOT NULL DEFAULT 0,
    "retry_times" integer NOT NULL DEFAULT 0,
    "last_call_time" datetime_text NULL,
    "next_call_time" datetime_text NOT NULL DEFAULT (CURRENT_TIMESTAMP),
    "create_time" datetime_text NOT NULL DEFAULT (CURRENT_TIMESTAMP),
    "version" integer NOT NULL DEFAULT 0,
    "load_balance_num" integer NOT NULL DEFAULT 0,
    "idempotency_key" varchar(255) NULL,
    "target_override" text NULL,
    "leased" boolean NOT NULL DEFAULT FALSE,
    "trace_context" text NULL,
    ordering_key VARCHAR(255) NULL,
    "step" integer NOT NULL DEFAULT 0,
    "step_result" text NULL,
    "not_before" datetime_text NULL,
    origin smallint NOT NULL DEFAULT 0 CHECK (origin BETWEEN 0 AND 2)
)

--> statement-breakpoint

CREATE TABLE "notify_msg_history" (
    "id" integer NOT NULL PRIMARY KEY,
    "def_id" integer NOT NULL,
    "param" text NOT NULL,
    "description" text NOT NULL DEFAULT '',
    "errors" text NOT NULL DEFAULT '',
    "status" smallint NOT NULL DEFAULT 0,
    "retry_times" integer NOT NULL DEFAULT 0,
    "last_call_time" datetime_text NULL,
    "next_call_time" datetime_text NOT NULL DEFAULT (CURRENT_TIMESTAMP),
    "create_time" datetime_text NOT NULL DEFAULT (CURRENT_TIMESTAMP),
    "version" integer NOT NULL DEFAULT 0,
    "load_balance_num" integer NOT NULL DEFAULT 0,
    "idempotency_key" varchar(255) NULL,
    "target_override" text NULL,
    "leased" boolean NOT NULL DEFAULT FALSE,
    "trace_context" text NULL,
    ordering_key VARCHAR(255) NULL,
    "step" integer NOT NULL DEFAULT 0,
    "step_result" text NULL,
    "not_before" datetime_text NULL,
    origin smallint NOT NULL DEFAULT 0 CHECK (origin BETWEEN 0 AND 2)
)

--> statement-breakpoint

CREATE TABLE "notify_worker" (
    "id" varchar(255) NOT NULL PRIMARY KEY,
    "host" varchar(255) NOT NULL,
    "pid" integer NOT NULL,
    "started_at" datetime_text NOT NULL,
    "seen_at" datetime_text NOT NULL,
    "sweeps" integer NOT NULL DEFAULT 0,
    "claimed" integer NOT NULL DEFAULT 0,
    "succeeded" integer NOT NULL DEFAULT 0,
    "failed" integer NOT NULL DEFAULT 0,
    "beat_secs" double NOT NULL DEFAULT 5
)

--> statement-breakpoint

CREATE TABLE "notify_rate" (
    "def_id" integer NOT NULL PRIMARY KEY,
    "window_no" integer NOT NULL DEFAULT 0,
    "used" integer NOT NULL DEFAULT 0
)

--> statement-breakpoint

CREATE INDEX "idx_notify_msg_due" ON "notify_msg" ("next_call_time")

--> statement-breakpoint

CREATE INDEX "idx_notify_msg_partition_due" ON "notify_msg" ("load_balance_num", "next_call_time")

--> statement-breakpoint

CREATE INDEX "idx_notify_msg_def_due" ON "notify_msg" ("def_id", "next_call_time")

--> statement-breakpoint

CREATE INDEX "idx_notify_msg_history_def_status" ON "notify_msg_history" ("def_id", "status", "create_time")

--> statement-breakpoint

CREATE INDEX "idx_notify_msg_history_finished" ON "notify_msg_history" ("last_call_time", "def_id", "status")

--> statement-breakpoint

CREATE UNIQUE INDEX idx_notify_msg_def_key ON notify_msg (def_id, idempotency_key) WHERE idempotency_key IS NOT NULL

--> statement-breakpoint

CREATE INDEX idx_notify_msg_def_order ON notify_msg (def_id, ordering_key, create_time, id) WHERE ordering_key IS NOT NULL

--> statement-breakpoint

CREATE INDEX idx_notify_msg_def_order_held ON notify_msg (def_id, ordering_key) WHERE ordering_key IS NOT NULL AND leased

--> statement-breakpoint

CREATE INDEX idx_notify_msg_history_def_order ON notify_msg_history (def_id, ordering_key, create_time, id) WHERE ordering_key IS NOT NULL AND status IN (3, 6)

--> statement-breakpoint

CREATE INDEX idx_notify_msg_history_def_order_held ON notify_msg_history (def_id, ordering_key) WHERE ordering_key IS NOT NULL AND leased

--> statement-breakpoint

CREATE INDEX idx_notify_msg_history_def_key ON notify_msg_history (def_id, idempotency_key) WHERE idempotency_key IS NOT NULL

--> statement-breakpoint

CREATE INDEX idx_notify_def_update_time ON notify_def (update_time)

--> statement-breakpoint

CREATE INDEX idx_notify_def_paused_until ON notify_def (paused_until)

--> statement-breakpoint

CREATE TRIGGER solid_notify_def_touched AFTER UPDATE ON notify_def FOR EACH ROW WHEN NEW.update_time = OLD.update_time BEGIN
    UPDATE notify_def SET update_time = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE id = NEW.id;
    END

--> statement-breakpoint

-- Rows from producers in any language: a time written in another form
-- than the library's (`YYYY-MM-DD HH:MM:SS[.fff]`, UTC) is rewritten into
-- it (ISO 8601 with `T`, fractions, `Z` or an offset; a Unix time or a
-- Julian day, `strftime`'s `auto`); a new notice (version 0) with a time
-- in none of these forms is refused, naming the column. A future
-- `next_call_time` of a plain-SQL row is copied into `not_before`.
CREATE TRIGGER solid_notify_insert_times AFTER INSERT ON notify_msg FOR EACH ROW BEGIN
    SELECT RAISE(ABORT, 'notify_msg.next_call_time is not a time SQLite reads: write ISO 8601 text (UTC, or with an offset such as +02:00), a Unix time or a Julian day') WHERE NEW.version = 0 AND NOT (typeof(NEW.next_call_time) = 'text' AND NEW.next_call_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.next_call_time, 20) NOT GLOB '*[^0-9.]*') AND strftime('%Y-%m-%d %H:%M:%f', NEW.next_call_time, 'auto') IS NULL;
    SELECT RAISE(ABORT, 'notify_msg.create_time is not a time SQLite reads: write ISO 8601 text (UTC, or with an offset such as +02:00), a Unix time or a Julian day') WHERE NEW.version = 0 AND NOT (typeof(NEW.create_time) = 'text' AND NEW.create_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.create_time, 20) NOT GLOB '*[^0-9.]*') AND strftime('%Y-%m-%d %H:%M:%f', NEW.create_time, 'auto') IS NULL;
    SELECT RAISE(ABORT, 'notify_msg.not_before is not a time SQLite reads: write ISO 8601 text (UTC, or with an offset such as +02:00), a Unix time or a Julian day') WHERE NEW.version = 0 AND NEW.not_before IS NOT NULL AND NOT (typeof(NEW.not_before) = 'text' AND NEW.not_before GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.not_before, 20) NOT GLOB '*[^0-9.]*') AND strftime('%Y-%m-%d %H:%M:%f', NEW.not_before, 'auto') IS NULL;
    SELECT RAISE(ABORT, 'notify_msg.last_call_time is not a time SQLite reads: write ISO 8601 text (UTC, or with an offset such as +02:00), a Unix time or a Julian day') WHERE NEW.version = 0 AND NEW.last_call_time IS NOT NULL AND NOT (typeof(NEW.last_call_time) = 'text' AND NEW.last_call_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.last_call_time, 20) NOT GLOB '*[^0-9.]*') AND strftime('%Y-%m-%d %H:%M:%f', NEW.last_call_time, 'auto') IS NULL;
    UPDATE notify_msg SET next_call_time = CASE WHEN next_call_time IS NULL OR (typeof(next_call_time) = 'text' AND next_call_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(next_call_time, 20) NOT GLOB '*[^0-9.]*') THEN next_call_time ELSE COALESCE(strftime('%Y-%m-%d %H:%M:%f', next_call_time, 'auto'), next_call_time) END, create_time = CASE WHEN create_time IS NULL OR (typeof(create_time) = 'text' AND create_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(create_time, 20) NOT GLOB '*[^0-9.]*') THEN create_time ELSE COALESCE(strftime('%Y-%m-%d %H:%M:%f', create_time, 'auto'), create_time) END, not_before = CASE WHEN not_before IS NULL OR (typeof(not_before) = 'text' AND not_before GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(not_before, 20) NOT GLOB '*[^0-9.]*') THEN not_before ELSE COALESCE(strftime('%Y-%m-%d %H:%M:%f', not_before, 'auto'), not_before) END, last_call_time = CASE WHEN last_call_time IS NULL OR (typeof(last_call_time) = 'text' AND last_call_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(last_call_time, 20) NOT GLOB '*[^0-9.]*') THEN last_call_time ELSE COALESCE(strftime('%Y-%m-%d %H:%M:%f', last_call_time, 'auto'), last_call_time) END WHERE ((NOT (typeof(NEW.next_call_time) = 'text' AND NEW.next_call_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.next_call_time, 20) NOT GLOB '*[^0-9.]*')) OR (NOT (typeof(NEW.create_time) = 'text' AND NEW.create_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.create_time, 20) NOT GLOB '*[^0-9.]*')) OR (NEW.not_before IS NOT NULL AND NOT (typeof(NEW.not_before) = 'text' AND NEW.not_before GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.not_before, 20) NOT GLOB '*[^0-9.]*')) OR (NEW.last_call_time IS NOT NULL AND NOT (typeof(NEW.last_call_time) = 'text' AND NEW.last_call_time GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND substr(NEW.last_call_time, 20) NOT GLOB '*[^0-9.]*'))) AND id = NEW.id;
    UPDATE notify_msg SET not_before = next_call_time WHERE NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0 AND id = NEW.id AND substr(next_call_time, 1, 23) > strftime('%Y-%m-%d %H:%M:%f', 'now');
    END
