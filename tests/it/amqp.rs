//! AMQP channel and confirmations against the real RabbitMQ on 127.0.0.1:5672.

use std::{process::Command, sync::Arc, time::Duration};

use futures::StreamExt;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ExchangeDeclareOptions,
        QueueBindOptions, QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable},
};
use serde_json::json;
use solid_notify::{
    AttemptResult, Config, Notifier, Status, Worker, WorkerConfig,
    channel::amqp::AmqpConfig,
    confirm::ConfirmOutcome,
    def::{Channel as DefChannel, DefSpec, store},
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

use crate::{
    db_test,
    support::{Alerts, TestDb, eventually, test_config},
};

/// Tests share the broker; the restart test takes it alone. The rule
/// holds across test processes (nextest runs each test in its own): it is a
/// PostgreSQL advisory lock, held by the guard's own session and released
/// when the guard drops its connection.
pub struct BrokerLock(#[allow(dead_code)] sea_orm::sqlx::PgConnection);

/// The advisory lock's key ("solid-notify broker").
const BROKER_LOCK_KEY: i64 = 0x736e_6272_6f6b;

/// The broker, shared with other tests.
pub async fn broker_shared() -> BrokerLock {
    broker_lock("pg_advisory_lock_shared").await
}

/// The broker alone: waits for every test using it, in any process.
pub async fn broker_alone() -> BrokerLock {
    broker_lock("pg_advisory_lock").await
}

async fn broker_lock(function: &str) -> BrokerLock {
    use sea_orm::sqlx::{Connection, PgConnection};
    let base = std::env::var("SN_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let mut conn = PgConnection::connect(&format!("{base}/postgres"))
        .await
        .expect("PostgreSQL for the broker's lock");
    sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(format!(
        "SELECT {function}({BROKER_LOCK_KEY})"
    )))
    .execute(&mut conn)
    .await
    .expect("the broker's lock");
    BrokerLock(conn)
}

pub fn broker_url() -> String {
    std::env::var("SN_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A private exchange, a bound queue and a confirmation queue name.
pub struct Rabbit {
    _conn: Connection,
    pub ch: Channel,
    pub exchange: String,
    pub queue: String,
    pub confirm_queue: String,
}

pub struct Message {
    pub id: String,
    pub attempt: i64,
    pub reply_to: String,
    pub body: serde_json::Value,
    /// The W3C `traceparent` header, if sent.
    pub traceparent: Option<String>,
}

impl Rabbit {
    pub async fn new(db: &TestDb) -> Rabbit {
        let prefix = format!(
            "sn_t_{}",
            db.url
                .rsplit(['/', '\\'])
                .next()
                .unwrap()
                .replace(['.', '?', '='], "_")
        );
        let conn = Connection::connect(&broker_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ on 127.0.0.1:5672 (.ci/run starts it)");
        let ch = conn.create_channel().await.unwrap();
        let exchange = format!("{prefix}_x");
        let queue = format!("{prefix}_q");
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "rk".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        Rabbit {
            _conn: conn,
            ch,
            exchange,
            queue,
            confirm_queue: format!("{prefix}_confirm"),
        }
    }

    pub fn config(&self) -> Config {
        Config {
            amqp: AmqpConfig {
                url: Some(broker_url()),
                confirm_queue: self.confirm_queue.clone(),
                connect_timeout: Duration::from_secs(2),
            },
            ..test_config()
        }
    }

    pub async fn def(
        &self,
        db: &TestDb,
        name: &str,
        routing_key: &str,
        edit: impl FnOnce(&mut DefSpec),
    ) {
        let target = json!({"exchange": self.exchange, "routing_key": routing_key, "headers": {"x-tenant": "acme"}});
        let mut spec = DefSpec::new(name, DefChannel::Amqp, target);
        spec.retry_interval = "1s".into();
        edit(&mut spec);
        store::sync(&db.db, &[spec]).await.unwrap();
    }

    /// Every message in the bound queue until `n` have arrived.
    pub async fn take(&self, n: usize) -> Vec<Message> {
        let mut consumer = self
            .ch
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
                .await
                .expect("message arrives")
                .unwrap()
                .unwrap();
            let p = &delivery.properties;
            let headers = p.headers().clone().unwrap_or_default();
            let attempt = match headers.inner().get("x-notice-attempt") {
                Some(AMQPValue::LongLongInt(n)) => *n,
                other => panic!("attempt header {other:?}"),
            };
            assert!(matches!(
                headers.inner().get("x-tenant"),
                Some(AMQPValue::LongString(_))
            ));
            out.push(Message {
                id: p.message_id().as_ref().unwrap().to_string(),
                attempt,
                reply_to: p.reply_to().as_ref().unwrap().to_string(),
                body: serde_json::from_slice(&delivery.data).unwrap(),
                traceparent: match headers.inner().get("traceparent") {
                    Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                    None => None,
                    other => panic!("traceparent header {other:?}"),
                },
            });
            delivery.ack(BasicAckOptions::default()).await.unwrap();
        }
        out
    }

    /// Messages waiting in the bound queue.
    pub async fn queued(&self) -> u32 {
        self.ch
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    pub async fn reply(&self, queue: &str, body: serde_json::Value) {
        self.ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.to_string().as_bytes(),
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

fn worker(notifier: Notifier) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let config = WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(notifier, config).unwrap();
    let stop = CancellationToken::new();
    let token = stop.clone();
    (
        stop,
        tokio::spawn(async move {
            worker
                .run(token)
                .await
                .expect("the worker refused to start")
        }),
    )
}

async fn stop((stop, task): (CancellationToken, tokio::task::JoinHandle<()>)) {
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
}

db_test!(
    publish_lands_and_broker_ack_finishes,
    |db: Arc<TestDb>| async move {
        let _shared = broker_shared().await;
        let rabbit = Rabbit::new(&db).await;
        rabbit.def(&db, "orders", "rk", |_| {}).await;
        let notifier = db.notifier().config(rabbit.config()).build().unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add_notice("orders", &json!({"order": 7}), "")
            .await
            .unwrap();
        // The attempt waits for the broker's ack and then records the success.
        let report = tx.commit_and_wait().await.unwrap();
        assert_eq!(report[0].result, AttemptResult::Succeeded);
        let done = db.history_of(id).await.unwrap();
        assert_eq!(done.status, Status::Succeeded);
        let message = rabbit.take(1).await.pop().unwrap();
        assert_eq!((message.id, message.attempt), (id.to_string(), 1));
        assert_eq!(message.reply_to, rabbit.confirm_queue);
        assert_eq!(message.body, json!({"order": 7}));
    }
);

db_test!(unroutable_mandatory_is_a_failed_attempt, |db: Arc<
    TestDb,
>| async move {
    let _shared = broker_shared().await;
    let rabbit = Rabbit::new(&db).await;
    rabbit
        .def(&db, "lost", "no-such-binding", |s| {
            s.retry_interval = "1h".into()
        })
        .await;
    let notifier = db.notifier().config(rabbit.config()).build().unwrap();
    let tx = notifier.begin().await.unwrap();
    let id = tx.add_notice("lost", &json!({}), "").await.unwrap();
    tx.commit().await.unwrap();
    let row = eventually(10, "return recorded", || async {
        db.live()
            .await
            .into_iter()
            .find(|r| r.id == id && r.retry_times == 1)
    })
    .await;
    assert_eq!(row.status, Status::Failed);
    assert!(
        row.errors.contains("returned by the broker: 312 NO_ROUTE"),
        "{}",
        row.errors
    );
});

db_test!(
    consumer_confirms_and_rejects_through_the_queue,
    |db: Arc<TestDb>| async move {
        let _shared = broker_shared().await;
        let rabbit = Rabbit::new(&db).await;
        rabbit
            .def(&db, "confirmed", "rk", |s| {
                s.need_confirm = true;
                s.max_confirm_delay = 60;
                s.retry_interval = "1h".into();
            })
            .await;
        let notifier = db.notifier().config(rabbit.config()).build().unwrap();
        let running = worker(notifier.clone());
        let tx = notifier.begin().await.unwrap();
        let yes = tx
            .add_notice("confirmed", &json!({"n": 1}), "")
            .await
            .unwrap();
        let no = tx
            .add_notice("confirmed", &json!({"n": 2}), "")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let messages = rabbit.take(2).await;
        // Confirm at once: a confirmation may even beat the attempt's bookkeeping.
        for m in &messages {
            let ok = m.id == yes.to_string();
            let id: i64 = m.id.parse().unwrap();
            let body = if ok {
                json!({"id": id, "ok": true})
            } else {
                json!({"id": id, "ok": false, "reason": "customer unknown"})
            };
            rabbit.reply(&m.reply_to, body).await;
        }
        let done = eventually(15, "confirmation applied", || async {
            db.history_of(yes).await
        })
        .await;
        assert_eq!(done.retry_times, 0, "confirmed on the first attempt");
        assert_eq!(done.status, Status::Succeeded);
        let rejected = eventually(15, "rejection applied", || async {
            db.live()
                .await
                .into_iter()
                .find(|r| r.id == no && r.retry_times == 1)
        })
        .await;
        assert_eq!(rejected.status, Status::Failed);
        assert!(
            rejected.errors.ends_with("attempt 1: customer unknown"),
            "{}",
            rejected.errors
        );
        stop(running).await;
    }
);

db_test!(unconfirmed_is_resent_then_fails_with_alert, |db: Arc<
    TestDb,
>| async move {
    let _shared = broker_shared().await;
    let rabbit = Rabbit::new(&db).await;
    rabbit
        .def(&db, "silent", "rk", |s| {
            s.need_confirm = true;
            s.max_confirm_delay = 1;
            s.max_retry_times = 1;
        })
        .await;
    let alerts = Alerts::default();
    let notifier = db
        .notifier()
        .config(rabbit.config())
        .alert_hook(alerts.clone())
        .build()
        .unwrap();
    let running = worker(notifier.clone());
    let tx = notifier.begin().await.unwrap();
    let id = tx.add_notice("silent", &json!({}), "").await.unwrap();
    tx.commit().await.unwrap();
    let done = eventually(20, "final failure", || async { db.history_of(id).await }).await;
    stop(running).await;
    assert_eq!((done.status, done.retry_times), (Status::FinalFailure, 2));
    let lines: Vec<&str> = done.errors.lines().collect();
    assert_eq!(lines.len(), 2, "{}", done.errors);
    assert!(
        lines.iter().all(|l| l.ends_with("not confirmed within 1s")),
        "{}",
        done.errors
    );
    let attempts: Vec<i64> = rabbit.take(2).await.iter().map(|m| m.attempt).collect();
    assert_eq!(attempts, [1, 2], "sent, then resent after the deadline");
    let events = alerts.events();
    assert_eq!(events.len(), 1);
    assert!(events[0].is_final && events[0].notice_id == id);
});

db_test!(
    late_duplicate_and_unknown_confirmations_are_harmless,
    |db: Arc<TestDb>| async move {
        let _shared = broker_shared().await;
        let rabbit = Rabbit::new(&db).await;
        rabbit
            .def(&db, "acks", "rk", |s| {
                s.need_confirm = true;
                s.max_confirm_delay = 60;
            })
            .await;
        let notifier = db.notifier().config(rabbit.config()).build().unwrap();
        let running = worker(notifier.clone());
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("acks", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        let message = rabbit.take(1).await.pop().unwrap();
        eventually(10, "awaiting confirmation", || async {
            db.live()
                .await
                .into_iter()
                .find(|r| r.status == Status::AwaitingConfirm)
        })
        .await;
        // Garbage and an unknown id on the queue do not stop the listener.
        rabbit
            .reply(&message.reply_to, json!("not a confirmation"))
            .await;
        rabbit
            .reply(&message.reply_to, json!({"id": 987654321, "ok": true}))
            .await;
        rabbit
            .reply(&message.reply_to, json!({"id": id, "ok": true}))
            .await;
        eventually(15, "confirmed through the queue", || async {
            db.history_of(id).await
        })
        .await;
        // Twice, late, rejected after the fact, unknown: answered, nothing changes.
        assert_eq!(
            notifier.confirm(id).await.unwrap(),
            ConfirmOutcome::AlreadyFinished {
                status: Status::Succeeded
            }
        );
        assert_eq!(
            notifier.reject(id, "too late").await.unwrap(),
            ConfirmOutcome::AlreadyFinished {
                status: Status::Succeeded
            }
        );
        assert_eq!(
            notifier.confirm(987654321).await.unwrap(),
            ConfirmOutcome::Unknown
        );
        stop(running).await;
        assert_eq!(db.history_of(id).await.unwrap().status, Status::Succeeded);
        // A notice that was never sent is not confirmable.
        let quiet = db
            .notifier()
            .config(Config {
                immediate_attempt: false,
                ..rabbit.config()
            })
            .build()
            .unwrap();
        let tx = quiet.begin().await.unwrap();
        let unsent = tx.add_notice("acks", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            quiet.confirm(unsent).await.unwrap(),
            ConfirmOutcome::NotAwaiting {
                status: Status::NotSent
            }
        );
        // The library call confirms a waiting notice directly.
        quiet.sweep_once(10).await.unwrap();
        eventually(10, "awaiting", || async {
            db.live()
                .await
                .into_iter()
                .find(|r| r.id == unsent && r.status == Status::AwaitingConfirm)
        })
        .await;
        assert_eq!(
            quiet.confirm(unsent).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
    }
);

fn rabbitmqctl(arg: &str) {
    let status = Command::new("rabbitmqctl")
        .arg(arg)
        .output()
        .expect("rabbitmqctl");
    assert!(
        status.status.success(),
        "rabbitmqctl {arg}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

db_test!(broker_restart_loses_nothing, |db: Arc<TestDb>| async move {
    let _alone = broker_alone().await;
    let rabbit = Rabbit::new(&db).await;
    rabbit.def(&db, "durable", "rk", |_| {}).await;
    let notifier = db.notifier().config(rabbit.config()).build().unwrap();
    let running = worker(notifier.clone());
    let add = |n: usize| {
        let notifier = notifier.clone();
        async move {
            let tx = notifier.begin().await.unwrap();
            for i in 0..n {
                tx.add_notice("durable", &json!({"i": i}), "")
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
        }
    };
    add(10).await;
    rabbitmqctl("stop_app");
    add(10).await; // published while the broker is down: retried
    tokio::time::sleep(Duration::from_millis(500)).await;
    rabbitmqctl("start_app");
    rabbitmqctl("await_startup");
    add(10).await;
    eventually(90, "every notice confirmed", || async {
        let (live, done) = db.counts().await;
        (live == 0 && done == 30).then_some(())
    })
    .await;
    stop(running).await;
    assert!(
        db.history()
            .await
            .iter()
            .all(|h| h.status == Status::Succeeded)
    );
});
