package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

const (
	accounts = 100
	events   = 3000
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// result is what one ordering did.
type result struct {
	ordering   consumer.Ordering
	took       time.Duration
	outOfOrder int    // events applied after a later event of their account
	applied    int    // distinct events applied
	retries    uint64 // failed first attempts run again
	peak       int64  // most handler runs at once
}

// run publishes the events and applies them under each ordering; ctx
// bounds the whole run.
func run(ctx context.Context, out io.Writer) ([]result, error) {
	url := os.Getenv("NATS_URL")
	if url == "" {
		dir, err := os.MkdirTemp("", "sluice-ordered")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		srv, err := natstest.Run(dir)
		if err != nil {
			return nil, err
		}
		defer srv.WaitForShutdown()
		defer srv.Shutdown()
		url = srv.ClientURL()
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	_ = js.DeleteStream(ctx, "ACCOUNTS") // a fresh run against a shared server
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACCOUNTS", Subjects: []string{"accounts.>"}}); err != nil {
		return nil, err
	}

	// Each event carries its account's next sequence number; the subject
	// names the account, and the NATS Source's key is the subject.
	next := make([]int, accounts)
	var futs []jetstream.PubAckFuture
	for range events {
		a := rand.IntN(accounts)
		next[a]++
		f, err := js.PublishAsync("accounts."+strconv.Itoa(a), []byte(strconv.Itoa(next[a])))
		if err != nil {
			return nil, err
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	fmt.Fprintf(out, "published %d events on %d accounts\n", events, accounts)

	var results []result
	for _, o := range []consumer.Ordering{consumer.Unordered, consumer.ByPartition, consumer.ByKey} {
		r, err := consume(ctx, js, o)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "%-12s %6v  %4d of %d events applied out of order, %d retried, %d at once at most\n",
			o, r.took.Round(10*time.Millisecond), r.outOfOrder, r.applied, r.retries, r.peak)
		results = append(results, r)
	}
	return results, nil
}

// consume applies every event once on a durable of its own, with the route
// ordered by o, and counts events applied after a later one of their
// account.
func consume(ctx context.Context, js jetstream.JetStream, o consumer.Ordering) (result, error) {
	src, err := natsadapter.NewSourceFor(ctx, js, "ACCOUNTS", jetstream.ConsumerConfig{Durable: "ledger-" + o.String()},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		return result{}, err
	}
	var mu sync.Mutex
	applied := map[string]int{} // account → highest sequence applied
	seen := map[string]bool{}   // account/sequence applied
	res := result{ordering: o}
	var running, peak atomic.Int64
	apply := func(_ context.Context, m *consumer.Message) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond) // the downstream call
		if m.Attempt == 1 && rand.IntN(100) < 3 {
			return errors.New("downstream timeout")
		}
		account := strings.TrimPrefix(m.Topic, "accounts.")
		seq, _ := strconv.Atoi(string(m.Value))
		mu.Lock()
		defer mu.Unlock()
		if seq < applied[account] {
			res.outOfOrder++
		}
		applied[account] = max(applied[account], seq)
		seen[account+"/"+string(m.Value)] = true
		return nil
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "ledger", Source: src, Handler: apply, Workers: 8, Ordering: o,
		Retry: consumer.RetryPolicy{BaseDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
	})
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	stats, err := sluicetest.RunUntil(ctx, c, time.Hour, func(s []consumer.RouteStats) bool { // ctx bounds it
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == events
	})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return result{}, err
	}
	res.took = time.Since(start)
	res.applied = len(seen)
	res.peak = peak.Load()
	// An Unordered route nak's a failed event (OutcomeRetried); an ordered
	// one retries it in place (Order.Retries).
	res.retries = stats[0].Settled[consumer.OutcomeRetried] + stats[0].Order.Retries
	return res, nil
}
