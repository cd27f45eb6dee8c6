"""`infr cluster`: infr engines as Ray Serve replicas behind one OpenAI-compatible ingress
(app: the application and running it; ingress: routes and relaying; replica: one engine;
routing: prefix-aware replica choice; metrics: the merged /metrics; config: the knobs)."""
