package deploy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
)

// Query is one PromQL expression of a dashboard panel.
type Query struct {
	Panel string // the panel's title
	Expr  string
}

// DashboardQueries returns every target expression of a Grafana dashboard
// JSON model, panels nested in rows included, in panel order. It fails on
// JSON that does not parse and on a dashboard without panels.
func DashboardQueries(dashboard []byte) ([]Query, error) {
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("deploy: dashboard: %w", err)
	}
	if len(d.Panels) == 0 {
		return nil, fmt.Errorf("deploy: dashboard has no panels")
	}
	var out []Query
	var walk func([]json.RawMessage) error
	walk = func(ps []json.RawMessage) error {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				return fmt.Errorf("deploy: panel: %w", err)
			}
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, Query{Panel: p.Title, Expr: t.Expr})
				}
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk(d.Panels)
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	metricName = regexp.MustCompile(`\bsluice_[a-zA-Z0-9_:]+`)
)

// MetricNames returns the sluice_* metric names expr refers to, sorted and
// without duplicates. Names inside quoted strings (label values) are not
// metric references and are skipped.
func MetricNames(expr string) []string {
	names := metricName.FindAllString(quoted.ReplaceAllString(expr, `""`), -1)
	slices.Sort(names)
	return slices.Compact(names)
}
