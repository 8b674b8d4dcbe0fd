"""Consumer-side helpers: process each outbox event once (the inbox pattern)."""
