-- The W3C trace context of the request that created a run: the run's aggregation, webhook
-- delivery and republished jobs join that trace. NULL when the creator had no trace context.
ALTER TABLE runs ADD COLUMN traceparent text;
