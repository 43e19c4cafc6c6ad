"""Replicas on other hosts: a writer ships its index to an S3-compatible bucket (bases: snapshot archives;
the tail: changelog segments), replicas copy and follow it. See docs/deployment.md, "Across hosts"."""
