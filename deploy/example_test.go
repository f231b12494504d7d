package deploy_test

import (
	"fmt"

	"github.com/sluice-go/sluice/deploy"
)

func ExampleMetricNames() {
	expr := `sum by (route) (rate(sluice_settled_total{outcome="expired",route=~"sluice_.*"}[1m]))
	  / sum by (route) (rate(sluice_fetched_total[1m]))`
	fmt.Println(deploy.MetricNames(expr))
	// Output: [sluice_fetched_total sluice_settled_total]
}

func ExampleDashboardQueries() {
	qs, err := deploy.DashboardQueries([]byte(`{"panels": [
	  {"title": "Goodput", "targets": [{"expr": "rate(sluice_goodput_total[1m])"}]},
	  {"type": "row", "panels": [{"title": "Oldest", "targets": [{"expr": "sluice_oldest_inflight_seconds"}]}]}
	]}`))
	if err != nil {
		panic(err)
	}
	for _, q := range qs {
		fmt.Printf("%s: %s\n", q.Panel, q.Expr)
	}
	// Output:
	// Goodput: rate(sluice_goodput_total[1m])
	// Oldest: sluice_oldest_inflight_seconds
}
