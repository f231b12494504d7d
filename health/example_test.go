package health_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/health"
	"github.com/sluice-go/sluice/sluicetest"
)

// A service serves its consumer's health next to its metrics; the
// platform probes /healthz (liveness) and /readyz (readiness).
func Example() {
	c, err := consumer.New(consumer.Options{Health: consumer.HealthPolicy{StuckAfter: 2 * time.Minute}}, consumer.Route{
		Name: "orders", Source: sluicetest.NewSource(),
		Handler: func(context.Context, *consumer.Message) error { return nil },
	})
	if err != nil {
		panic(err)
	}
	h := health.Handler(c, health.Options{Grace: 30 * time.Second})

	// Before Run the route is stopped: not ready, but live.
	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		body, _ := io.ReadAll(rec.Body)
		first, _, _ := strings.Cut(string(body), "\n")
		fmt.Println(path, rec.Code, first)
	}
	// Output:
	// /healthz 200 ok
	// /readyz 503 route "orders" stopped: Run has not started
}
