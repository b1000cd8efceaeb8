//! Settling deliveries on a real broker channel: a batch acked with a `multiple` ack must not
//! settle a delivery outside it (the broker would then refuse that delivery's own nack and
//! close the channel).

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use skilleval_worker::acks::{ack_batch, AckWindow};

use crate::helpers::amqp_url;

#[tokio::test]
async fn a_batch_acked_around_a_delivery_still_open_leaves_it_to_be_nacked_and_redelivered() {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let queue = format!("skilleval-test-acks-{}", uuid::Uuid::now_v7());
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for n in 1..=6u8 {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &[n],
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "acks-test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let window = AckWindow::new();
    let mut pending = Vec::new();
    for _ in 0..6 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .expect("hang guard: no delivery after 30 s")
            .expect("the consumer is open")
            .unwrap();
        pending.push((
            delivery.data[0],
            window.received(delivery.acker.clone(), delivery.delivery_tag),
        ));
    }
    let message = |n: u8| pending.iter().find(|(m, _)| *m == n).unwrap().1.clone();

    // 1, 2, 4 and 5 are committed while 3 is still being graded: one multiple ack may cover
    // 1 and 2 only.
    let failed = ack_batch(vec![message(1), message(2), message(4), message(5)]).await;
    assert_eq!(failed, 0);
    // 3 fails and is returned to the queue, 6 is acked alone: both frames are accepted.
    assert!(message(3).nack_requeue().await);
    assert!(message(6).ack().await);

    let again = tokio::time::timeout(Duration::from_secs(30), consumer.next())
        .await
        .expect("hang guard: 3 had not come back after 30 s")
        .expect("the consumer is open")
        .unwrap();
    assert_eq!(again.data, vec![3]);
    assert!(again.redelivered);
    let again = window.received(again.acker.clone(), again.delivery_tag);
    assert!(again.ack().await);
    // Nothing else comes back, and the channel survived every settlement (a tag settled
    // twice would have closed it).
    assert!(
        tokio::time::timeout(Duration::from_millis(300), consumer.next())
            .await
            .is_err(),
        "no other delivery"
    );
    assert!(channel.status().connected(), "{:?}", channel.status());
    let deleted = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(deleted, 0, "every message settled");
    conn.close(200, "done".into()).await.unwrap();
}
