"""One router per resource: messages, queues, topics, policies, health."""
