package deploy_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/deploy"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	composeFile   = "../docker-compose.yaml"
	dashboardFile = "grafana/dashboards/sluice.json"
)

// exported gathers the metric families package metrics really exports for
// a consumer with one route, with the label names of each. Histograms
// contribute their _bucket, _sum and _count series.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	// A second route with an adaptive limit: its gauge exists only then.
	adaptive, err := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Min: 1, Max: 4})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, *consumer.Message) error { return nil }
	_, err = consumer.New(consumer.Options{Observer: obs}, consumer.Route{
		Name:     "orders",
		Source:   sluicetest.NewSource(),
		Workers:  1,
		Handler:  noop,
		Window:   consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
		Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical},
	}, consumer.Route{
		Name:     "reports",
		Source:   sluicetest.NewSource(),
		Workers:  1,
		Handler:  noop,
		Window:   consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
		Overload: consumer.OverloadPolicy{AdaptiveLimit: adaptive},
	})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, mf := range mfs {
		var labels []string
		if len(mf.GetMetric()) > 0 {
			for _, lp := range mf.GetMetric()[0].GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[mf.GetName()+"_bucket"] = append(slices.Clone(labels), "le")
			out[mf.GetName()+"_sum"] = labels
			out[mf.GetName()+"_count"] = labels
		default:
			out[mf.GetName()] = labels
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d metric families gathered: %v", len(out), out)
	}
	return out
}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"instance", "job"}

var (
	selector = regexp.MustCompile(`(sluice_[a-zA-Z0-9_:]+)\s*\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := deploy.DashboardQueries(raw)
	if err != nil {
		t.Fatal(err)
	}
	have := exported(t)
	outcomes := map[string]bool{}
	for _, o := range consumer.Outcomes() {
		outcomes[o.String()] = true
	}
	used := map[string]bool{}
	for _, q := range qs {
		names := deploy.MetricNames(q.Expr)
		if len(names) == 0 {
			t.Errorf("panel %q: query %q uses no sluice metric", q.Panel, q.Expr)
		}
		labelsOf := map[string]bool{}
		for _, l := range targetLabels {
			labelsOf[l] = true
		}
		for _, n := range names {
			used[n] = true
			ls, ok := have[n]
			if !ok {
				t.Errorf("panel %q queries %s, which package metrics does not export", q.Panel, n)
				continue
			}
			for _, l := range ls {
				labelsOf[l] = true
			}
		}
		for _, m := range selector.FindAllStringSubmatch(q.Expr, -1) {
			ls := have[m[1]]
			for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
				if !slices.Contains(ls, lm[1]) && !slices.Contains(targetLabels, lm[1]) {
					t.Errorf("panel %q: %s has no label %q (labels %v)", q.Panel, m[1], lm[1], ls)
				}
				if lm[1] == "outcome" && lm[2] == "=" && !outcomes[lm[3]] {
					t.Errorf("panel %q: outcome %q is not a consumer.Outcome", q.Panel, lm[3])
				}
			}
		}
		for _, g := range grouping.FindAllStringSubmatch(q.Expr, -1) {
			for _, l := range strings.Split(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !labelsOf[l] {
					t.Errorf("panel %q groups by %q, a label none of %v has", q.Panel, l, names)
				}
			}
		}
	}
	// What the issue asks the dashboard to show, by the metric behind it.
	for what, metric := range map[string]string{
		"goodput":              "sluice_goodput_total",
		"in-flight":            "sluice_window_in_use_messages",
		"window":               "sluice_window_limit_messages",
		"blocked time":         "sluice_window_blocked_seconds_total",
		"expired, shed, DLQ":   "sluice_settled_total",
		"oldest age per route": "sluice_oldest_inflight_seconds",
		"shed by reason":       "sluice_shed_total",
	} {
		if !used[metric] {
			t.Errorf("dashboard does not show %s (%s)", what, metric)
		}
	}
	for _, outcome := range []string{"expired", "dead_lettered"} {
		if !strings.Contains(string(raw), `outcome=\"`+outcome+`\"`) {
			t.Errorf("dashboard has no panel on outcome %q", outcome)
		}
	}
}

func TestDashboardModel(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			GridPos struct {
				X int `json:"x"`
				Y int `json:"y"`
				W int `json:"w"`
				H int `json:"h"`
			} `json:"gridPos"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" {
		t.Error("dashboard has no uid (links /d/<uid> would break)")
	}
	uids := datasourceUIDs(t)
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
			t.Errorf("panel %q: gridPos %+v outside Grafana's 24-column grid", p.Title, g)
		}
		if !uids[p.Datasource.UID] {
			t.Errorf("panel %q uses datasource %q, not provisioned (have %v)", p.Title, p.Datasource.UID, uids)
		}
	}
}

func datasourceUIDs(t *testing.T) map[string]bool {
	t.Helper()
	var ds struct {
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	readYAML(t, "grafana/provisioning/datasources/prometheus.yaml", &ds)
	out := map[string]bool{}
	for _, d := range ds.Datasources {
		if d.Type != "prometheus" || !strings.Contains(d.URL, "prometheus:9090") {
			t.Errorf("datasource %+v does not point at the compose Prometheus", d)
		}
		out[d.UID] = true
	}
	return out
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type service struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Ports       []string          `yaml:"ports"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
}

func TestCompose(t *testing.T) {
	var c struct {
		Services map[string]service `yaml:"services"`
		Volumes  map[string]any     `yaml:"volumes"`
	}
	readYAML(t, composeFile, &c)
	for _, name := range []string{"kafka", "nats", "prometheus", "grafana"} {
		s, ok := c.Services[name]
		if !ok {
			t.Fatalf("service %q missing", name)
		}
		if s.Image == "" || !strings.Contains(s.Image, ":") || strings.HasSuffix(s.Image, ":latest") {
			t.Errorf("service %q: image %q is not pinned", name, s.Image)
		}
	}
	k := c.Services["kafka"]
	if !strings.HasPrefix(k.Image, "apache/kafka:") {
		t.Errorf("kafka image %q, want apache/kafka", k.Image)
	}
	if roles := k.Environment["KAFKA_PROCESS_ROLES"]; !strings.Contains(roles, "broker") || !strings.Contains(roles, "controller") {
		t.Errorf("kafka is not a single KRaft node (KAFKA_PROCESS_ROLES=%q)", roles)
	}
	for key := range k.Environment {
		if strings.Contains(strings.ToUpper(key), "ZOOKEEPER") {
			t.Errorf("kafka configures ZooKeeper (%s): KRaft only", key)
		}
	}
	if !strings.Contains(k.Environment["KAFKA_ADVERTISED_LISTENERS"], "127.0.0.1:9092") {
		t.Errorf("kafka does not advertise 127.0.0.1:9092 to host clients: %q", k.Environment["KAFKA_ADVERTISED_LISTENERS"])
	}
	if n := c.Services["nats"]; !slices.Contains(n.Command, "-js") {
		t.Errorf("nats runs without JetStream: command %v", n.Command)
	}
	wantPorts := map[string]string{"kafka": "9092", "nats": "4222", "prometheus": "9090", "grafana": "3000"}
	for name, port := range wantPorts {
		if !slices.ContainsFunc(c.Services[name].Ports, func(p string) bool { return strings.HasPrefix(p, port+":") }) {
			t.Errorf("service %q does not publish port %s: %v", name, port, c.Services[name].Ports)
		}
	}
	// Every bind mount must exist in the repository; named volumes must be
	// declared.
	mounts := map[string]string{} // container path -> host path
	for name, s := range c.Services {
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Errorf("service %q: volume %q", name, v)
				continue
			}
			host, target := parts[0], parts[1]
			if strings.HasPrefix(host, ".") || strings.HasPrefix(host, "/") {
				if _, err := os.Stat(filepath.Join("..", host)); err != nil {
					t.Errorf("service %q mounts %s, which does not exist: %v", name, host, err)
				}
				mounts[target] = host
			} else if _, ok := c.Volumes[host]; !ok {
				t.Errorf("service %q uses volume %q, not declared", name, host)
			}
		}
	}
	if mounts["/etc/prometheus/prometheus.yml"] != "./deploy/prometheus/prometheus.yml" {
		t.Errorf("prometheus does not mount deploy/prometheus/prometheus.yml: %v", mounts)
	}
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/provisioning/dashboards/sluice.yaml", &prov)
	if len(prov.Providers) != 1 {
		t.Fatalf("%d dashboard providers, want 1", len(prov.Providers))
	}
	dir, ok := mounts[prov.Providers[0].Options.Path]
	if !ok {
		t.Fatalf("dashboard provider reads %s, which grafana does not mount: %v", prov.Providers[0].Options.Path, mounts)
	}
	if _, err := os.Stat(filepath.Join("..", dir, filepath.Base(dashboardFile))); err != nil {
		t.Errorf("the provisioned dashboard directory has no %s: %v", filepath.Base(dashboardFile), err)
	}
	if mounts["/etc/grafana/provisioning"] != "./deploy/grafana/provisioning" {
		t.Errorf("grafana does not mount the provisioning directory: %v", mounts)
	}
	if home := c.Services["grafana"].Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" {
		if filepath.Dir(home) != prov.Providers[0].Options.Path {
			t.Errorf("grafana home dashboard %s is outside the provisioned path", home)
		}
	}
}

func TestPrometheusScrapesTheExamples(t *testing.T) {
	var p struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &p)
	targets := map[string]bool{}
	for _, sc := range p.ScrapeConfigs {
		if sc.JobName == "" {
			t.Error("scrape config without job_name")
		}
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				targets[tg] = true
			}
		}
	}
	// The examples serve /metrics on $METRICS_ADDR; the compose file's
	// header gives these ports.
	compose, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	for example, port := range map[string]string{"quickstart": "9464", "overloadlab": "9465"} {
		if !targets["host.docker.internal:"+port] {
			t.Errorf("prometheus does not scrape %s on host.docker.internal:%s: %v", example, port, targets)
		}
		if !strings.Contains(string(compose), "METRICS_ADDR=0.0.0.0:"+port+" go run ./examples/"+example) {
			t.Errorf("docker-compose.yaml does not tell how to run %s on port %s", example, port)
		}
		src, err := os.ReadFile(filepath.Join("..", "examples", example, "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), `"METRICS_ADDR"`) {
			t.Errorf("examples/%s does not read METRICS_ADDR", example)
		}
	}
}

// The dashboard shows one series per instance: every query keeps the
// instance label through its aggregations, follows the instance variable,
// and names the instance in its legend.
func TestDashboardPerInstance(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name, Definition, AllValue string
				IncludeAll, Multi          bool
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Name == "instance" {
			if !v.IncludeAll || !v.Multi || v.AllValue != ".*" || !strings.HasSuffix(v.Definition, ", instance)") {
				t.Errorf("instance variable %+v: want label_values(..., instance), multi, All = .*", v)
			}
		}
	}
	if !vars["instance"] || !vars["route"] {
		t.Fatalf("dashboard variables %v, want route and instance", vars)
	}
	aggregation := regexp.MustCompile(`\b(?:sum|max|min|avg|count)\s+by\s*\(([^)]*)\)`)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			aggs := aggregation.FindAllStringSubmatch(tg.Expr, -1)
			if len(aggs) == 0 {
				t.Errorf("panel %q: %s aggregates nothing by instance", p.Title, tg.Expr)
			}
			for _, a := range aggs {
				if !slices.Contains(strings.Fields(strings.ReplaceAll(a[1], ",", " ")), "instance") {
					t.Errorf("panel %q: %q drops the instance label: %s", p.Title, a[0], tg.Expr)
				}
			}
			for _, sel := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(sel[2], `instance=~"$instance"`) || !strings.Contains(sel[2], `route=~"$route"`) {
					t.Errorf("panel %q: %s does not follow the route and instance variables", p.Title, sel[0])
				}
			}
			if !strings.Contains(tg.LegendFormat, "{{instance}}") {
				t.Errorf("panel %q: legend %q does not name the instance (%s)", p.Title, tg.LegendFormat, tg.Expr)
			}
		}
	}
}

// The fleet profile: replicas of examples/service on the stack's brokers,
// each scraped by Prometheus as its own instance.
func TestComposeFleet(t *testing.T) {
	type fleetService struct {
		service  `yaml:",inline"`
		Profiles []string `yaml:"profiles"`
		Build    struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Deploy struct {
			Replicas int `yaml:"replicas"`
		} `yaml:"deploy"`
		ContainerName string `yaml:"container_name"`
		DependsOn     any    `yaml:"depends_on"` // a list or a map
	}
	var c struct {
		Services map[string]fleetService `yaml:"services"`
	}
	readYAML(t, composeFile, &c)
	s, ok := c.Services["service"]
	if !ok {
		t.Fatal(`no "service" service (examples/service replicas)`)
	}
	if !slices.Contains(s.Profiles, "fleet") {
		t.Errorf("service profiles %v: want fleet (plain docker compose up starts no replicas)", s.Profiles)
	}
	if s.Deploy.Replicas != 3 {
		t.Errorf("service runs %d replicas, want 3", s.Deploy.Replicas)
	}
	if s.ContainerName != "" || len(s.Ports) > 0 {
		t.Errorf("service sets container_name %q or publishes ports %v: replicas would collide", s.ContainerName, s.Ports)
	}
	deps, _ := s.DependsOn.(map[string]any)
	for _, dep := range []string{"kafka", "nats"} {
		if cond, _ := deps[dep].(map[string]any); cond["condition"] != "service_healthy" {
			t.Errorf("service does not wait for %s to be healthy: %v", dep, s.DependsOn)
		}
	}
	// The image builds examples/service from the repository.
	if s.Build.Context != "." {
		t.Errorf("service build context %q, want the repository root", s.Build.Context)
	}
	df, err := os.ReadFile(filepath.Join("..", s.Build.Dockerfile))
	if err != nil {
		t.Fatalf("service Dockerfile: %v", err)
	}
	if !strings.Contains(string(df), "go build") || !strings.Contains(string(df), "./examples/service") {
		t.Errorf("%s does not build ./examples/service", s.Build.Dockerfile)
	}
	// It talks to the stack's brokers on the compose network.
	env := s.Environment
	if env["NATS_URL"] != "nats://nats:4222" {
		t.Errorf("service NATS_URL %q, want nats://nats:4222", env["NATS_URL"])
	}
	kafkaListeners := c.Services["kafka"].Environment["KAFKA_ADVERTISED_LISTENERS"]
	if b := env["KAFKA_BROKERS"]; b == "" || !strings.Contains(kafkaListeners, "//"+b) {
		t.Errorf("service KAFKA_BROKERS %q is not a listener kafka advertises (%s)", b, kafkaListeners)
	}
	_, port, err := net.SplitHostPort(env["METRICS_ADDR"])
	if err != nil || !strings.HasPrefix(env["METRICS_ADDR"], "0.0.0.0:") {
		t.Fatalf("service METRICS_ADDR %q: want 0.0.0.0:PORT (reachable from prometheus): %v", env["METRICS_ADDR"], err)
	}
	src, err := os.ReadFile("../examples/service/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"NATS_URL", "KAFKA_BROKERS", "METRICS_ADDR"} {
		if !strings.Contains(string(src), `"`+v+`"`) {
			t.Errorf("examples/service does not read %s", v)
		}
	}
	// Prometheus discovers every replica: the service's DNS name resolves to
	// all of them, each scraped as its own target (instance label).
	var p struct {
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
				Type  string   `yaml:"type"`
				Port  int      `yaml:"port"`
			} `yaml:"dns_sd_configs"`
			RelabelConfigs []struct {
				TargetLabel string `yaml:"target_label"`
			} `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &p)
	found := false
	for _, sc := range p.ScrapeConfigs {
		for _, sd := range sc.DNSSDConfigs {
			if slices.Contains(sd.Names, "service") {
				found = true
				if sd.Type != "A" || strconv.Itoa(sd.Port) != port {
					t.Errorf("job %s: dns_sd %+v, want type A on port %s", sc.JobName, sd, port)
				}
			}
		}
		for _, rc := range sc.RelabelConfigs {
			if rc.TargetLabel == "instance" {
				t.Errorf("job %s rewrites the instance label: replicas could share one", sc.JobName)
			}
		}
	}
	if !found {
		t.Error("prometheus does not discover the service's replicas (dns_sd_configs names: [service])")
	}
	if !strings.Contains(string(readFile(t, composeFile)), "docker compose --profile fleet up") {
		t.Error("docker-compose.yaml does not tell how to start the replicas")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestComposeHealthchecks: every service of the compose stack has a
// healthcheck (issue 29), and the service replicas probe themselves with
// the binary's -healthcheck flag (the distroless image has no shell or
// curl), which examples/service defines.
func TestComposeHealthchecks(t *testing.T) {
	var c struct {
		Services map[string]struct {
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	readYAML(t, composeFile, &c)
	for name, s := range c.Services {
		if len(s.Healthcheck.Test) == 0 {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	if got := strings.Join(c.Services["service"].Healthcheck.Test, " "); got != "CMD /service -healthcheck" {
		t.Errorf("service healthcheck %q, want the binary probing itself", got)
	}
	df := string(readFile(t, "service/Dockerfile"))
	if !strings.Contains(df, "COPY --from=build /out/service /service") {
		t.Error("the image does not put the binary at /service, where the healthcheck runs it")
	}
	src := string(readFile(t, "../examples/service/main.go"))
	if !strings.Contains(src, `flag.Bool("healthcheck"`) {
		t.Error("examples/service has no -healthcheck flag")
	}
}
