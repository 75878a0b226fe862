-- The baseline schema of solid-notify on MySQL/MariaDB (ADR 0013): what
-- the 24 pre-release migrations built, in one migration. Statements are
-- separated by statement-breakpoint lines; the equivalence test
-- (tests/it/baseline.rs) checks it against the old chain's schema. The
-- tables take the database's default character set and collation; keys
-- compare byte for byte (utf8mb4_nopad_bin on MariaDB; the migration
-- puts the server's binary collation of no padding in its place, else
-- utf8mb4_bin).

CREATE TABLE `notify_def` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `name` varchar(191) NOT NULL,
  `channel` varchar(32) NOT NULL,
  `target` text NOT NULL,
  `retry_interval` varchar(255) NOT NULL,
  `max_retry_times` int(11) NOT NULL,
  `max_retry_interval` int(11) NOT NULL,
  `alert_trigger_type` smallint(6) NOT NULL,
  `alert_trigger_fail_times` int(11) NOT NULL,
  `email` text NOT NULL DEFAULT '',
  `need_confirm` tinyint(1) NOT NULL DEFAULT 0,
  `max_confirm_delay` int(11) NOT NULL DEFAULT 0,
  `description` text NOT NULL DEFAULT '',
  `create_time` datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  `update_time` datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  `paused_until` datetime(6) DEFAULT NULL,
  `pause_reason` text DEFAULT NULL,
  `circuit_failures` int(11) NOT NULL DEFAULT 0,
  `circuit_window` int(11) NOT NULL DEFAULT 60,
  `circuit_cool_down` int(11) NOT NULL DEFAULT 300,
  `on_error` varchar(16) NOT NULL DEFAULT 'retry',
  `immediate_retries` int(11) NOT NULL DEFAULT 0,
  `immediate_retry_delay` int(11) NOT NULL DEFAULT 100,
  `retry_jitter` smallint(6) NOT NULL DEFAULT 0,
  `rate_limit` varchar(32) NOT NULL DEFAULT '',
  `ordering` varchar(16) NOT NULL DEFAULT '',
  `stop_on_failure` tinyint(1) NOT NULL DEFAULT 1,
  `steps` longtext NOT NULL DEFAULT '',
  `events_to` varchar(191) NOT NULL DEFAULT '',
  `encrypt` tinyint(1) NOT NULL DEFAULT 0,
  PRIMARY KEY (`id`),
  UNIQUE KEY `name` (`name`),
  KEY `idx_notify_def_update_time` (`update_time`),
  KEY `idx_notify_def_paused_until` (`paused_until`)
)

--> statement-breakpoint

CREATE TABLE `notify_msg` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `def_id` bigint(20) NOT NULL,
  `param` longtext NOT NULL,
  `description` longtext NOT NULL DEFAULT '',
  `errors` longtext NOT NULL DEFAULT '',
  `status` smallint(6) NOT NULL DEFAULT 0,
  `retry_times` int(11) NOT NULL DEFAULT 0,
  `last_call_time` datetime(6) DEFAULT NULL,
  `next_call_time` datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  `create_time` datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  `version` int(11) NOT NULL DEFAULT 0,
  `load_balance_num` int(11) NOT NULL DEFAULT 0,
  `idempotency_key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin DEFAULT NULL,
  `target_override` text DEFAULT NULL,
  `leased` tinyint(1) NOT NULL DEFAULT 0,
  `trace_context` text DEFAULT NULL,
  `ordering_key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin DEFAULT NULL,
  `step` int(11) NOT NULL DEFAULT 0,
  `step_result` longtext DEFAULT NULL,
  `param_bytes` bigint(20) DEFAULT NULL,
  `not_before` datetime(6) DEFAULT NULL,
  `origin` smallint(6) NOT NULL DEFAULT 0 CHECK (`origin` between 0 and 2),
  PRIMARY KEY (`id`),
  UNIQUE KEY `idx_notify_msg_def_key` (`def_id`,`idempotency_key`),
  KEY `idx_notify_msg_due` (`next_call_time`),
  KEY `idx_notify_msg_partition_due` (`load_balance_num`,`next_call_time`),
  KEY `idx_notify_msg_def_due` (`def_id`,`next_call_time`),
  KEY `idx_notify_msg_def_order` (`def_id`,`ordering_key`,`create_time`,`id`),
  KEY `idx_notify_msg_def_order_held` (`def_id`,`ordering_key`,`leased`)
)

--> statement-breakpoint

CREATE TABLE `notify_msg_history` (
  `id` bigint(20) NOT NULL,
  `def_id` bigint(20) NOT NULL,
  `param` longtext NOT NULL,
  `description` longtext NOT NULL DEFAULT '',
  `errors` longtext NOT NULL DEFAULT '',
  `status` smallint(6) NOT NULL DEFAULT 0,
  `retry_times` int(11) NOT NULL DEFAULT 0,
  `last_call_time` datetime(6) DEFAULT NULL,
  `next_call_time` datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  `create_time` datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  `version` int(11) NOT NULL DEFAULT 0,
  `load_balance_num` int(11) NOT NULL DEFAULT 0,
  `idempotency_key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin DEFAULT NULL,
  `target_override` text DEFAULT NULL,
  `leased` tinyint(1) NOT NULL DEFAULT 0,
  `trace_context` text DEFAULT NULL,
  `ordering_key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin DEFAULT NULL,
  `step` int(11) NOT NULL DEFAULT 0,
  `step_result` longtext DEFAULT NULL,
  `not_before` datetime(6) DEFAULT NULL,
  `origin` smallint(6) NOT NULL DEFAULT 0 CHECK (`origin` between 0 and 2),
  PRIMARY KEY (`id`),
  KEY `idx_notify_msg_history_def_status` (`def_id`,`status`,`create_time`),
  KEY `idx_notify_msg_history_finished` (`last_call_time`,`def_id`,`status`),
  KEY `idx_notify_msg_history_def_key` (`def_id`,`idempotency_key`),
  KEY `idx_notify_msg_history_def_order` (`def_id`,`ordering_key`,`status`,`create_time`,`id`)
)

--> statement-breakpoint

CREATE TABLE `notify_rate` (
  `def_id` bigint(20) NOT NULL,
  `window_no` bigint(20) NOT NULL DEFAULT 0,
  `used` int(11) NOT NULL DEFAULT 0,
  PRIMARY KEY (`def_id`)
)

--> statement-breakpoint

CREATE TABLE `notify_worker` (
  `id` varchar(255) NOT NULL,
  `host` varchar(255) NOT NULL,
  `pid` int(11) NOT NULL,
  `started_at` datetime(6) NOT NULL,
  `seen_at` datetime(6) NOT NULL,
  `sweeps` bigint(20) NOT NULL DEFAULT 0,
  `claimed` bigint(20) NOT NULL DEFAULT 0,
  `succeeded` bigint(20) NOT NULL DEFAULT 0,
  `failed` bigint(20) NOT NULL DEFAULT 0,
  `beat_secs` double NOT NULL DEFAULT 5,
  PRIMARY KEY (`id`)
)

--> statement-breakpoint

CREATE TRIGGER solid_notify_def_touched BEFORE UPDATE ON notify_def FOR EACH ROW SET NEW.update_time = UTC_TIMESTAMP(6)

--> statement-breakpoint

CREATE TRIGGER solid_notify_not_before BEFORE INSERT ON notify_msg FOR EACH ROW IF NEW.not_before IS NULL AND NOT NEW.leased AND NEW.status = 0 AND NEW.next_call_time > UTC_TIMESTAMP(6) THEN SET NEW.not_before = NEW.next_call_time; END IF

--> statement-breakpoint

CREATE TRIGGER solid_notify_param_bytes BEFORE INSERT ON notify_msg FOR EACH ROW SET NEW.param_bytes = LENGTH(NEW.param) + COALESCE(LENGTH(NEW.step_result), 0)

--> statement-breakpoint

CREATE TRIGGER solid_notify_param_bytes_update BEFORE UPDATE ON notify_msg FOR EACH ROW SET NEW.param_bytes = LENGTH(NEW.param) + COALESCE(LENGTH(NEW.step_result), 0)
