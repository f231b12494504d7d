package health

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// Checker reports health; *consumer.Consumer is one.
type Checker interface {
	Health() consumer.Health
}

var _ Checker = (*consumer.Consumer)(nil)

// Options configure the handlers.
type Options struct {
	// Grace is how long a route must have been stuck or failed before
	// liveness fails. 0 means none: liveness fails as soon as a route is
	// (consumer.HealthPolicy.StuckAfter is already a bound for stuck).
	// Negative is treated as 0.
	Grace time.Duration
}

// Handler serves /healthz (Live) and /readyz (Ready); other paths are 404.
func Handler(c Checker, o Options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", Live(c, o))
	mux.Handle("/readyz", Ready(c))
	return mux
}

// Live answers 503 when a route has been stuck or failed for Options.Grace
// or longer (consumer.Health.Live), 200 otherwise.
func Live(c Checker, o Options) http.Handler {
	grace := max(o.Grace, 0)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := c.Health()
		ok, why := h.Live(grace)
		write(w, r, h, ok, why)
	})
}

// Ready answers 200 while every route is ready, 503 otherwise.
func Ready(c Checker) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := c.Health()
		ok, why := h.Ready()
		write(w, r, h, ok, why)
	})
}

func write(w http.ResponseWriter, r *http.Request, h consumer.Health, ok bool, why string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var b strings.Builder
	if ok {
		b.WriteString("ok\n")
	} else {
		b.WriteString(clean(why))
		b.WriteByte('\n')
	}
	for _, rh := range h.Routes {
		fmt.Fprintf(&b, "route %s: %s since %s: %s\n", clean(rh.Route), rh.State,
			rh.Since.UTC().Format(time.RFC3339), clean(rh.Reason))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	if r.Method != http.MethodHead {
		_, _ = w.Write([]byte(b.String()))
	}
}

// clean keeps a reason on its line: a broker's error text is data, and a
// newline or control byte in it must not forge another line.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
