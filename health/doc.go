// Package health serves a Consumer's health (consumer.Consumer.Health) to
// the probes of a platform such as Kubernetes, Nomad or systemd:
//
//	GET /healthz  liveness: 503 once a route has been stuck (held messages,
//	              no settlement for HealthPolicy.StuckAfter) or failed (its
//	              Source closed for good while Run goes on) for
//	              Options.Grace, so the platform restarts the process;
//	              200 otherwise, including while a broker is down (a
//	              restart would not bring it back).
//	GET /readyz   readiness: 200 while every route is ready (idle,
//	              progressing or shedding); 503 while one is stopped,
//	              failed, not ready (broker connection down, Kafka group
//	              not formed, consumer deleted) or stuck.
//
// Both answer in plain text: a first line ("ok", or what failed) and one
// line per route with its state and the reason in words. The package
// imports only the standard library and the core.
package health
