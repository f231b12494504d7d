//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/deploy"
)

// EnvPrometheus names the prometheus server binary the dashboard test
// runs; by default it looks in $PATH and /usr/bin (Debian's prometheus
// package).
const EnvPrometheus = "SLUICE_PROMETHEUS"

const (
	dashboardFile  = "../../deploy/grafana/dashboards/sluice.json"
	promConfigFile = "../../deploy/prometheus/prometheus.yml"
	serviceJob     = "sluice-service" // the job scraping the replicas
	instances      = 3
	scrapeInterval = time.Second
	// rateInterval stands for Grafana's $__rate_interval: at least four
	// scrape intervals, with room for a late scrape on a busy machine.
	rateInterval = "10s"
)

// TestDashboardOnPrometheus checks the Grafana dashboard against a real
// Prometheus server: three instances of the service run as processes on one
// embedded NATS server and one kfake cluster, Prometheus scrapes them every
// second, and every query of the dashboard, evaluated through Prometheus's
// HTTP API with its template variables set to "All", must return a series
// for each of the three instances. A query that returns nothing, or
// lumps the instances together, is a dashboard bug.
func TestDashboardOnPrometheus(t *testing.T) {
	bin := prometheusBinary(t)
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := deploy.DashboardQueries(raw)
	if err != nil {
		t.Fatal(err)
	}
	variables := templateQueries(t, raw)
	// The whole compose configuration, as Prometheus itself reads it.
	if tool, err := exec.LookPath(filepath.Join(filepath.Dir(bin), "promtool")); err == nil {
		if out, err := exec.Command(tool, "check", "config", promConfigFile).CombinedOutput(); err != nil {
			t.Errorf("promtool check config %s: %v\n%s", promConfigFile, err, out)
		}
	} else {
		t.Logf("no promtool beside %s: %s is checked through its %s job only", bin, promConfigFile, serviceJob)
	}

	_, natsURL := natstest.Start(t)
	kc := kafkatest.Start(t)
	var targets []string
	for i := range instances {
		targets = append(targets, startInstance(t, i, natsURL, kc.Brokers))
	}
	prom := startPrometheus(t, bin, targets)

	// Wait until every instance has settled work on every route within the
	// rate window: the scrapes have happened and the Kafka group has given
	// every member its partitions.
	routes := []string{"orders", "reports", "payments"}
	ready := fmt.Sprintf(`sum by (instance, route) (rate(sluice_goodput_total[%s])) > 0`, rateInterval)
	deadline := time.Now().Add(90 * time.Second)
	for {
		series := prom.query(t, ready)
		have := map[string]bool{}
		for _, s := range series {
			have[s.Metric["instance"]+" "+s.Metric["route"]] = true
		}
		missing := []string{}
		for _, tg := range targets {
			for _, r := range routes {
				if !have[tg+" "+r] {
					missing = append(missing, tg+" "+r)
				}
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goodput after 90 s on %v (Prometheus has %v)", missing, series)
		}
		time.Sleep(500 * time.Millisecond) // polling Prometheus, not a synchronization
	}

	// The job's relabeling ran: the series carry the compose stack's labels.
	for _, s := range prom.query(t, `sluice_fetched_total{route="orders"}`) {
		if s.Metric["job"] != serviceJob || s.Metric["example"] != "service" {
			t.Errorf("series %v: want job %s, example service", s.Metric, serviceJob)
		}
	}

	for _, q := range queries {
		expr, note := evaluable(q.Expr)
		// A series an instance always exports can be missing from one
		// instant query for a moment (a -race run read one panel's series
		// for one instance of three while the others' were there): a
		// query is asked again for up to 10 s until every instance
		// answers; a dashboard bug still fails after that.
		series := prom.query(t, expr)
		for retry := time.Now().Add(10 * time.Second); time.Now().Before(retry) && !everyInstance(series, targets); {
			time.Sleep(500 * time.Millisecond) // polling Prometheus, not a synchronization
			series = prom.query(t, expr)
		}
		got := map[string]bool{}
		byRoute := false
		for _, s := range series {
			got[s.Metric["instance"]] = true
			got[s.Metric["instance"]+" "+s.Metric["route"]] = true
			_, r := s.Metric["route"]
			byRoute = byRoute || r
		}
		// A query kept per route has a series for every route of every
		// instance, but for what only some routes have.
		want := routes
		if slices.Contains(deploy.MetricNames(q.Expr), "sluice_adaptive_limit") {
			want = []string{"reports"} // the only route with an AdaptiveLimit
		}
		for _, tg := range targets {
			if !got[tg] {
				t.Errorf("panel %q: query %s\n\treturns no series for instance %s%s (got %d series: %v)", q.Panel, q.Expr, tg, note, len(series), series)
				continue
			}
			for _, r := range want {
				if byRoute && !got[tg+" "+r] {
					t.Errorf("panel %q: query %s\n\treturns no series for route %s of instance %s%s", q.Panel, q.Expr, r, tg, note)
				}
			}
		}
	}
	// The variables' values: every instance and every route is offered.
	for name, q := range variables {
		vals := prom.labelValues(t, q)
		want := routes
		if q.label == "instance" {
			want = targets
		}
		for _, w := range want {
			if !slices.Contains(vals, w) {
				t.Errorf("variable %s (%s) offers %v, not %s", name, q.def, vals, w)
			}
		}
	}
}

// labelValuesQuery is a template variable's label_values(metric, label).
type labelValuesQuery struct {
	def, match, label string
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// templateQueries returns the dashboard's query variables by name.
func templateQueries(t *testing.T, raw []byte) map[string]labelValuesQuery {
	t.Helper()
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]labelValuesQuery{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
		}
		out[v.Name] = labelValuesQuery{def: v.Definition, match: substitute(m[1]), label: m[2]}
	}
	return out
}

// trailingFilter is a comparison that keeps only some series of a query
// ("... > 0": show the resource cap only while it binds).
var trailingFilter = regexp.MustCompile(`\s*(>|<|>=|<=|==|!=)\s*[0-9.]+\s*$`)

// evaluable returns expr with Grafana's template variables set as the
// dashboard's "All" does, and without a trailing filter comparison: a
// filter hides the series while its condition is false (no resource cap
// binds, no pressure cause holds), which is the panel working, so the test
// checks that the series under the filter exist for every instance.
// everyInstance reports whether series hold one for each of targets.
func everyInstance(series []series, targets []string) bool {
	got := map[string]bool{}
	for _, s := range series {
		got[s.Metric["instance"]] = true
	}
	for _, tg := range targets {
		if !got[tg] {
			return false
		}
	}
	return true
}

func evaluable(expr string) (string, string) {
	expr = substitute(expr)
	if loc := trailingFilter.FindStringIndex(expr); loc != nil {
		return expr[:loc[0]], " (evaluated without its trailing filter " + strings.TrimSpace(expr[loc[0]:]) + ")"
	}
	return expr, ""
}

func substitute(expr string) string {
	return strings.NewReplacer(
		"$__rate_interval", rateInterval,
		"$__interval", "1s",
		"$route", ".*",
		"$instance", ".*",
	).Replace(expr)
}

// prometheusBinary finds the prometheus server or skips the test.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvPrometheus); p != "" {
		return p
	}
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/prometheus"); err == nil {
		return "/usr/bin/prometheus"
	}
	t.Skipf("SKIP: no prometheus server binary (not in $PATH, not /usr/bin/prometheus, $%s unset): "+
		"the dashboard is not checked against Prometheus. Install it: apt-get install prometheus (.ci/run does)", EnvPrometheus)
	return ""
}

// startInstance starts instance i of the service as a process of its own
// (this test binary, running main) and returns the address of its /metrics.
// It is stopped with SIGTERM at the end of the test and must exit 0.
func startInstance(t *testing.T, i int, natsURL string, brokers []string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-rate", "100")
	cmd.Env = append(os.Environ(), childEnv+"=1",
		"NATS_URL="+natsURL, "KAFKA_BROKERS="+strings.Join(brokers, ","), "METRICS_ADDR=127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log strings.Builder
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			log.WriteString(line + "\n")
			mu.Unlock()
			if a, ok := strings.CutPrefix(line, "metrics at http://"); ok {
				addr <- strings.TrimSuffix(a, "/metrics")
			}
		}
	}()
	output := func() string {
		mu.Lock()
		defer mu.Unlock()
		return log.String()
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		exited := make(chan error, 1)
		go func() { <-done; exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("instance %d: %v\n%s", i, err, output())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("instance %d did not stop within 15 s of SIGTERM\n%s", i, output())
		}
	})
	select {
	case a := <-addr:
		return a
	case <-done:
		t.Fatalf("instance %d exited before serving metrics:\n%s", i, output())
	case <-time.After(30 * time.Second):
		t.Fatalf("instance %d serves no metrics after 30 s:\n%s", i, output())
	}
	return ""
}

type promServer struct {
	base string
}

type series struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

func (s series) String() string { return fmt.Sprintf("%v=%v", s.Metric, s.Value) }

// scrapeConfig is the docker-compose Prometheus's job for the service's
// replicas (deploy/prometheus/prometheus.yml, relabeling and all) with the
// replicas' DNS discovery replaced by targets, scraped every second.
func scrapeConfig(t *testing.T, targets []string) []byte {
	t.Helper()
	raw, err := os.ReadFile(promConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []map[string]any `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", promConfigFile, err)
	}
	var job map[string]any
	for _, j := range cfg.ScrapeConfigs {
		if j["job_name"] == serviceJob {
			job = j
		}
	}
	if job == nil {
		t.Fatalf("%s has no job %s", promConfigFile, serviceJob)
	}
	if _, ok := job["dns_sd_configs"]; !ok {
		t.Fatalf("job %s does not find the replicas by DNS: %v", serviceJob, job)
	}
	delete(job, "dns_sd_configs")
	job["static_configs"] = []any{map[string]any{"targets": targets}}
	out, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": scrapeInterval.String(), "evaluation_interval": scrapeInterval.String()},
		"scrape_configs": []any{job},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startPrometheus runs the server scraping targets every second, with its
// own configuration and storage in temporary directories, on a free port of
// 127.0.0.1, and waits until it is ready. It is stopped at the end of the
// test.
func startPrometheus(t *testing.T, bin string, targets []string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, scrapeConfig(t, targets), 0o644); err != nil {
		t.Fatal(err)
	}
	// The port is found free, then given to the server: another process
	// may take it in between, so a start that finds it in use is retried.
	for attempt := 1; ; attempt++ {
		p, log, err := tryPrometheus(t, bin, cfgFile, filepath.Join(dir, fmt.Sprint("data", attempt)))
		if err == nil {
			return p
		}
		if attempt == 3 || !strings.Contains(log, "address already in use") {
			t.Fatalf("prometheus: %v\n%s", err, log)
		}
	}
}

// tryPrometheus starts the server once, on a port of 127.0.0.1 free a
// moment ago, and waits until it is ready; it returns the server's log
// when it is not.
func tryPrometheus(t *testing.T, bin, cfgFile, dataDir string) (*promServer, string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var log bytes.Buffer // written by the server's output copier until exit
	var logMu sync.Mutex
	cmd := exec.Command(bin,
		"--config.file="+cfgFile,
		"--storage.tsdb.path="+dataDir,
		"--web.listen-address="+addr,
		"--log.level=warn")
	w := writerFunc(func(b []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return log.Write(b)
	})
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	logText := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return log.String()
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	p := &promServer{base: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, "", nil
			}
		}
		select {
		case <-exited:
			return nil, logText(), fmt.Errorf("exited: %v", waitErr)
		default:
		}
		if time.Now().After(deadline) {
			return nil, logText(), fmt.Errorf("not ready after 30 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling for readiness
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// get calls the HTTP API and decodes its data, failing on any error or
// warning.
func (p *promServer) get(t *testing.T, path string, params url.Values, data any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+params.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Status    string          `json:"status"`
		Error     string          `json:"error"`
		Warnings  []string        `json:"warnings"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%s %v: %v: %s", path, params, err, body)
	}
	if r.Status != "success" || len(r.Warnings) > 0 {
		t.Fatalf("%s %v: %s %s: %s (warnings %v)", path, params, r.Status, r.ErrorType, r.Error, r.Warnings)
	}
	if err := json.Unmarshal(r.Data, data); err != nil {
		t.Fatalf("%s %v: %v: %s", path, params, err, r.Data)
	}
}

// query evaluates expr now (/api/v1/query); it must be an instant vector.
func (p *promServer) query(t *testing.T, expr string) []series {
	t.Helper()
	var d struct {
		ResultType string   `json:"resultType"`
		Result     []series `json:"result"`
	}
	p.get(t, "/api/v1/query", url.Values{"query": {expr}}, &d)
	if d.ResultType != "vector" {
		t.Fatalf("query %s: result type %s, want vector", expr, d.ResultType)
	}
	return d.Result
}

// labelValues is what Grafana's label_values(match, label) offers.
func (p *promServer) labelValues(t *testing.T, q labelValuesQuery) []string {
	t.Helper()
	var vals []string
	p.get(t, "/api/v1/label/"+q.label+"/values", url.Values{"match[]": {q.match}}, &vals)
	return vals
}
