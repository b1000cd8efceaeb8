-- The W3C trace context of the request that created a run: the run's aggregation, webhook
-- delivery and republished jobs join that trace. NULL when the creator had no trace context.
ALTER TABLE runs ADD COLUMN traceparent text;

-- A webhook delivery announcing a run is sent in that run's trace (a child of the span that
-- enqueued it); both NULL for deliveries without one.
ALTER TABLE webhook_deliveries ADD COLUMN run_id uuid;
ALTER TABLE webhook_deliveries ADD COLUMN traceparent text;
