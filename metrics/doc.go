// Package metrics exports sluice consumer stats to Prometheus.
//
// New registers one collector, which reads every route's stats at scrape
// time, and a handler-latency histogram, sluice_handler_duration_seconds
// {route, outcome}, and for routes with a consumer.BatchHandler three
// histograms per batch, sluice_batch_messages{route},
// sluice_batch_linger_seconds{route} and sluice_batch_duration_seconds
// {route}. It never touches the global registry:
//
//	reg := prometheus.NewRegistry()
//	obs, err := metrics.New(reg)
//	if err != nil { ... }
//	c, err := consumer.New(consumer.Options{Observer: obs}, routes...)
//	if err != nil { ... }
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Per route (labels route and criticality) it exports counters
// sluice_fetched_total, sluice_settled_total{outcome}, sluice_goodput_total,
// sluice_late_total, sluice_handler_errors_total, sluice_panics_total,
// sluice_malformed_deadlines_total, sluice_settle_errors_total,
// sluice_fetch_errors_total, sluice_keepalives_total and
// sluice_window_blocked_seconds_total, and gauges
// sluice_window_{in_use,limit,peak}_{messages,bytes} and
// sluice_oldest_inflight_seconds.
//
// Overload control adds counters sluice_shed_total{reason, class} (reason
// queue_full or near_deadline, class the message's criticality),
// sluice_retry_budget_exhausted_total and sluice_throttle_refused_total,
// and gauges sluice_throttle_probability and, for routes with an
// AdaptiveLimit, sluice_adaptive_limit (the message limit in force).
package metrics
