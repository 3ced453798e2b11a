"""OpenLineage for isbre: commit records become RunEvents, delivered through a durable outbox."""
