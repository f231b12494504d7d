// Package deploy holds the operational stack's configuration next to the
// code it describes: Prometheus (prometheus/prometheus.yml), Grafana
// provisioning and the sluice dashboard (grafana/), used by the repository's
// docker-compose.yaml. Its tests parse all of them and check that every
// sluice_* metric the dashboard queries is one package metrics really
// exports, so a renamed metric breaks the build, not the dashboard.
//
// The package's Go API is the small part of that check worth reusing:
// DashboardQueries lists a Grafana dashboard's PromQL expressions and
// MetricNames the metric names one expression uses.
package deploy
