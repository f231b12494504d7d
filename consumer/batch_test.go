package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// The tests in this file pin the batch contract (BatchHandler, BatchPolicy):
// each runs in a synctest bubble, so time is fake, handler costs are
// sleeps, and "nothing happened" assertions follow synctest.Wait.

// batchRoute is a batch route for the tests. Its 10 ms Linger (virtual
// time) makes a batch take every message already on its way: without one a
// free worker takes what is queued the moment it looks, so the batches'
// shapes depended on the scheduler (under -race, [m0 m1] [m2] instead of
// [m0 m1 m2]) and tests that name them failed now and then.
func batchRoute(name string, src consumer.Source, h consumer.BatchHandler) consumer.Route {
	return consumer.Route{
		Name:         name,
		Source:       src,
		BatchHandler: h,
		Workers:      1,
		Retry:        consumer.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Batch:        consumer.BatchPolicy{Linger: 10 * time.Millisecond},
	}
}

// batchLog records the ids of each batch a handler is given.
type batchLog struct {
	mu      sync.Mutex
	batches [][]string
}

func (l *batchLog) add(b *consumer.Batch) {
	ids := make([]string, b.Len())
	for i, m := range b.Messages {
		ids[i] = string(m.Key)
	}
	l.mu.Lock()
	l.batches = append(l.batches, ids)
	l.mu.Unlock()
}

func (l *batchLog) get() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.batches)
}

// settledOrder is a Hook recording each message's settlement, in order.
type settledOrder struct {
	mu  sync.Mutex
	ids []string
	out map[string]consumer.Outcome
}

func (s *settledOrder) HookRoute(consumer.RouteInfo) consumer.MessageHook { return s }
func (s *settledOrder) Held(ctx context.Context, _ *consumer.Message, _ consumer.Waits) context.Context {
	return ctx
}
func (s *settledOrder) Event(_ context.Context, m *consumer.Message, e consumer.Event) {
	if e.Kind != consumer.EventSettled {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		s.out = map[string]consumer.Outcome{}
	}
	id := string(m.Key)
	if len(m.Value) > 0 {
		id = string(m.Value)
	}
	s.ids = append(s.ids, id+":"+e.Outcome.String())
	s.out[id] = e.Outcome
}

// counts is a ledger record's settlement counts.
func counts(r sluicetest.Record) [5]int {
	dropped := 0
	if r.Dropped || r.Pending {
		dropped = 1
	}
	return [5]int{r.Deliveries, r.Acks, r.Naks, r.Terms, dropped}
}

func deadlineIn(d time.Duration) consumer.Headers {
	return consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(d))}}
}

// A backlog is taken in batches of at most MaxMessages, and batches grow
// to MaxMessages while the worker is busy; every message is acked once.
func TestBatchGrowsWithBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		const n = 250
		for i := range n {
			src.Publish(fmt.Sprint("m", i), []byte("v"), nil, time.Time{})
		}
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			time.Sleep(10 * time.Millisecond)
			return nil
		})
		r.Batch.MaxMessages = 100
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		total, full := 0, 0
		for _, b := range log.get() {
			if len(b) > 100 {
				t.Fatalf("batch of %d > MaxMessages", len(b))
			}
			if len(b) == 100 {
				full++
			}
			total += len(b)
		}
		ledger, errs := src.Ledger()
		for id, rec := range ledger {
			if rec.Acks != 1 || rec.Naks+rec.Terms != 0 {
				t.Fatalf("%s: %+v", id, rec)
			}
		}
		s := c.Stats()[0]
		if len(errs) > 0 || total != n || full == 0 || s.Settled[consumer.OutcomeSucceeded] != n || s.Batch.Messages != n {
			t.Fatalf("errs %v, handled %d in %d batches (%d full), stats %+v", errs, total, len(log.get()), full, s.Batch)
		}
	})
}

// With Linger 0 a free worker runs what is queued at once, even one
// message.
func TestBatchNoLingerRunsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			return nil
		})
		r.Batch.Linger = 0
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		start(t, c)
		synctest.Wait()
		src.Publish("m0", nil, nil, time.Time{})
		synctest.Wait()
		if got := log.get(); len(got) != 1 || len(got[0]) != 1 {
			t.Fatalf("batches %v: want [[m0]] without waiting", got)
		}
	})
}

// With a Linger a partial batch waits for more messages, up to the linger.
func TestBatchLingerCollects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			return nil
		})
		r.Batch.Linger = 100 * time.Millisecond
		r.Window.MinFetch = 1
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		start(t, c)
		src.Publish("m0", nil, nil, time.Time{})
		for i := 1; i <= 3; i++ {
			time.Sleep(20 * time.Millisecond)
			synctest.Wait()
			if got := log.get(); len(got) != 0 {
				t.Fatalf("ran %v before the linger was over", got)
			}
			src.Publish(fmt.Sprint("m", i), nil, nil, time.Time{})
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := log.get(); len(got) != 1 || !slices.Equal(got[0], []string{"m0", "m1", "m2", "m3"}) {
			t.Fatalf("batches %v: want one of m0..m3", got)
		}
	})
}

// Fail marks single messages: a permanent one is dead-lettered (written,
// then terminated), an overloaded one handed back, and the rest acked.
func TestBatchFailMarksSingleMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 10 {
			src.Publish(fmt.Sprint("m", i), []byte("v"), nil, time.Time{})
		}
		var sink sluicetest.Sink
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			for i, m := range b.Messages {
				switch {
				case string(m.Key) == "m3":
					b.Fail(i, consumer.Permanent(errors.New("bad row")))
				case string(m.Key) == "m5" && m.Attempt == 1:
					b.Fail(i, backpressure.Overloaded(errors.New("busy")))
				}
			}
			return nil
		})
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		ledger, errs := src.Ledger()
		for id, rec := range ledger {
			want := sluicetest.Record{Deliveries: 1, Acks: 1}
			switch id {
			case "m3":
				want = sluicetest.Record{Deliveries: 1, Terms: 1}
			case "m5":
				want = sluicetest.Record{Deliveries: 2, Naks: 1, Acks: 1}
			}
			if counts(rec) != counts(want) {
				t.Fatalf("%s: %+v, want %+v", id, rec, want)
			}
		}
		letters := sink.Letters()
		s := c.Stats()[0]
		if len(errs) > 0 || len(letters) != 1 || string(letters[0].Key) != "m3" || letters[0].Class != dlq.ClassPermanent ||
			s.Settled[consumer.OutcomeSucceeded] != 9 || s.Settled[consumer.OutcomeOverloaded] != 1 || s.Settled[consumer.OutcomeDeadLettered] != 1 {
			t.Fatalf("errs %v, letters %v, stats %+v", errs, letters, s.Settled)
		}
	})
}

// An error the handler returns applies to each message, each with its own
// attempts: retried while attempts are left, dead-lettered on the last,
// which on the broker's last delivery is never nak'd.
func TestBatchErrorAppliesToEach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 2
		for i := range 5 {
			src.Publish(fmt.Sprint("m", i), []byte("v"), nil, time.Time{})
		}
		var sink sluicetest.Sink
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			return errors.New("database down")
		})
		r.Retry.MaxAttempts = 2
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		ledger, errs := src.Ledger()
		for id, rec := range ledger {
			if counts(rec) != counts(sluicetest.Record{Deliveries: 2, Naks: 1, Terms: 1}) {
				t.Fatalf("%s: %+v", id, rec)
			}
		}
		for _, l := range sink.Letters() {
			if l.Class != dlq.ClassExhausted || l.Attempts != 2 || !strings.Contains(l.Err, "database down") {
				t.Fatalf("letter %+v", l)
			}
		}
		s := c.Stats()[0]
		if len(errs) > 0 || len(sink.Letters()) != 5 || s.Settled[consumer.OutcomeRetried] != 5 || s.Settled[consumer.OutcomeDeadLettered] != 5 {
			t.Fatalf("errs %v, letters %d, stats %+v", errs, len(sink.Letters()), s.Settled)
		}
	})
}

// A panic is recovered as a retryable error for every message.
func TestBatchPanicRetriesEach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 3 {
			src.Publish(fmt.Sprint("m", i), nil, nil, time.Time{})
		}
		calls := 0
		c, err := consumer.New(consumer.Options{}, batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			calls++
			if calls == 1 {
				panic("boom")
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		s := c.Stats()[0]
		if s.Errors.Panics != 1 || s.Settled[consumer.OutcomeRetried] != 3 || s.Settled[consumer.OutcomeSucceeded] != 3 {
			t.Fatalf("stats %+v %+v", s.Errors, s.Settled)
		}
	})
}

// A message whose deadline comes while its batch waits for more (Linger)
// is settled as expired and removed before the batch runs: the handler
// never sees it.
func TestBatchExpiredWhileFormingNeverRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			return nil
		})
		r.Batch.Linger = time.Second
		r.Batch.MaxMessages = 10
		r.Window.MinFetch = 1
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		start(t, c)
		src.Publish("soon", nil, deadlineIn(50*time.Millisecond), time.Time{})
		time.Sleep(10 * time.Millisecond)
		src.Publish("later", nil, deadlineIn(time.Hour), time.Time{})
		src.Publish("none", nil, nil, time.Time{})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		got := log.get()
		s := c.Stats()[0]
		if len(got) != 1 || !slices.Equal(got[0], []string{"later", "none"}) ||
			s.Settled[consumer.OutcomeExpired] != 1 || s.Settled[consumer.OutcomeSucceeded] != 2 {
			t.Fatalf("batches %v, stats %+v", got, s.Settled)
		}
	})
}

// Once the route has learned its batch cost (here 10 ms + 1 ms a message),
// a batch is cut so that its predicted end comes before the earliest
// deadline in it, and a message that cannot make it even alone is expired
// without running: no message reaches the handler after its deadline, and
// no success is late.
func TestBatchCutBeforeEarliestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		var log batchLog
		var mu sync.Mutex
		var exposed []string
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			now := time.Now()
			var earliest time.Time
			for _, m := range b.Messages {
				d, ok := m.Deadline()
				if ok && !now.Before(d) {
					mu.Lock()
					exposed = append(exposed, string(m.Key))
					mu.Unlock()
				}
				if ok && (earliest.IsZero() || d.Before(earliest)) {
					earliest = d
				}
			}
			if cd, ok := ctx.Deadline(); ok != !earliest.IsZero() || !cd.Equal(earliest) {
				t.Errorf("ctx deadline %v, want the batch's earliest %v", cd, earliest)
			}
			time.Sleep(10*time.Millisecond + time.Duration(b.Len())*time.Millisecond)
			return nil
		})
		r.Batch.MaxMessages = 100
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		start(t, c)
		id := learnBatchCost(t, src, c)
		bs := c.Stats()[0].Batch
		if bs.Fixed < 9*time.Millisecond || bs.Fixed > 11*time.Millisecond || bs.PerMessage < 900*time.Microsecond || bs.PerMessage > 1100*time.Microsecond {
			t.Fatalf("learned %v + %v a message, want about 10ms + 1ms", bs.Fixed, bs.PerMessage)
		}
		warm := len(log.get())
		// 100 messages that must finish within 60 ms: about 40 fit in a
		// first batch, hardly any in a second.
		for i := range 100 {
			src.Publish(fmt.Sprint("d", i), nil, deadlineIn(60*time.Millisecond), time.Time{})
		}
		time.Sleep(time.Second)
		synctest.Wait()
		s := c.Stats()[0]
		var sizes []int
		for _, b := range log.get()[warm:] {
			sizes = append(sizes, len(b))
		}
		ok := s.Settled[consumer.OutcomeSucceeded] - uint64(id)
		if len(exposed) > 0 || s.Late != 0 || ok == 0 || ok+s.Settled[consumer.OutcomeExpired] != 100 || slices.Max(sizes) >= 100 {
			t.Fatalf("exposed %v, late %d, succeeded %d, expired %d, batches %v", exposed, s.Late, ok, s.Settled[consumer.OutcomeExpired], sizes)
		}
		t.Logf("deadline batches %v; succeeded %d, expired %d (early %d)", sizes, ok, s.Settled[consumer.OutcomeExpired], s.Overload.ExpiredEarly)
	})
}

// learnBatchCost runs backlogs of several sizes without deadlines through
// c (running, fed by src) so its route learns its batch cost, and returns
// how many messages it ran.
func learnBatchCost(t *testing.T, src *sluicetest.Source, c *consumer.Consumer) int {
	t.Helper()
	id := 0
	for round, size := range []int{1, 40, 5, 80, 20, 60, 2, 100, 10, 30} {
		for range size {
			src.Publish(fmt.Sprint("w", id), nil, nil, time.Time{})
			id++
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := c.Stats()[0].Settled[consumer.OutcomeSucceeded]; got != uint64(id) {
			t.Fatalf("round %d: %d settled of %d", round, got, id)
		}
	}
	return id
}

// Under overload (a full window) batches stay full: messages that could
// make a small batch but not a full one are left behind (and expire) rather
// than cutting the batch short for the fresher ones; without overload the
// batch is cut for them instead, and every message makes it.
func TestBatchOverloadKeepsBatchesFull(t *testing.T) {
	for _, overload := range []bool{true, false} {
		t.Run(fmt.Sprint("overload=", overload), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := sluicetest.NewSource()
				var log batchLog
				block := make(chan struct{})
				r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
					log.add(b)
					if string(b.Messages[0].Key) == "blocker" {
						<-block
					}
					time.Sleep(10*time.Millisecond + time.Duration(b.Len())*time.Millisecond)
					return nil
				})
				r.Batch.MaxMessages = 20 // a window of 40
				r.Batch.Linger = 0       // batches take what is queued: the overload rule, not a linger, keeps them full
				c, err := consumer.New(consumer.Options{}, r)
				if err != nil {
					t.Fatal(err)
				}
				start(t, c)
				warm := learnBatchCost(t, src, c)
				// The worker is busy while the others arrive.
				src.Publish("blocker", nil, nil, time.Time{})
				synctest.Wait()
				loose := 9
				if overload {
					loose = 31 // with the blocker and the tight ones: the whole window
				}
				// 8 tight ones make a batch of 8 (about 18 ms), not of 20 (30 ms,
				// plus the margins).
				for i := range 8 {
					src.Publish(fmt.Sprint("t", i), nil, deadlineIn(40*time.Millisecond), time.Time{})
				}
				for i := range loose {
					src.Publish(fmt.Sprint("l", i), nil, deadlineIn(time.Hour), time.Time{})
				}
				synctest.Wait()
				first := len(log.get())
				close(block)
				time.Sleep(time.Second)
				synctest.Wait()
				s := c.Stats()[0]
				after := log.get()[first:]
				ok := s.Settled[consumer.OutcomeSucceeded] - uint64(warm) - 1
				if overload {
					for _, b := range after {
						for _, id := range b {
							if id[0] == 't' {
								t.Fatalf("batches %v: a tight message ran in a full window", after)
							}
						}
					}
					if len(after[0]) != 20 || ok != uint64(loose) || s.Settled[consumer.OutcomeExpired] != 8 || s.Late != 0 {
						t.Fatalf("batches %v, succeeded %d, expired %d, late %d", after, ok, s.Settled[consumer.OutcomeExpired], s.Late)
					}
				} else if ok != uint64(8+loose) || s.Settled[consumer.OutcomeExpired] != 0 || s.Late != 0 {
					t.Fatalf("batches %v, succeeded %d, expired %d, late %d", after, ok, s.Settled[consumer.OutcomeExpired], s.Late)
				}
				t.Logf("batches %v", after)
			})
		})
	}
}

// The window bounds batches: messages in forming and running batches hold
// their slots until settled, and nothing more is fetched meanwhile; two
// workers run two batches at once.
func TestBatchWindowHoldsRunningBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 20 {
			src.Publish(fmt.Sprint("m", i), []byte("v"), nil, time.Time{})
		}
		release := make(chan struct{})
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			log.add(b)
			<-release
			return nil
		})
		r.Workers = 2
		r.Batch.MaxMessages = 3
		r.Window.Messages = 6
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait()
		s := c.Stats()[0]
		// Without a linger a free worker takes what is queued when it
		// looks, so the two batches hold 1 to 3 messages each (a -race run
		// formed [m0 m1] and [m2]); whatever they do not hold waits queued,
		// in the window all the same.
		got := log.get()
		if len(got) != 2 || len(got[0]) > 3 || len(got[1]) > 3 || s.Window.InUse != 6 || s.Held != 6 || s.Fetched != 6 {
			close(release)
			t.Fatalf("batches %v, in use %d, held %d, fetched %d: want two running batches of at most 3, and the window full", got, s.Window.InUse, s.Held, s.Fetched)
		}
		close(release)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		s = c.Stats()[0]
		if s.Settled[consumer.OutcomeSucceeded] != 20 || s.Window.Peak > 6 {
			t.Fatalf("succeeded %d, peak %d", s.Settled[consumer.OutcomeSucceeded], s.Window.Peak)
		}
	})
}

// On a ByKey route a batch holds a key's messages in delivery order; when
// one fails, its key's later messages in the batch are held, not settled:
// never acked ahead of it, they run again after it in a later batch (their
// attempt not counted), while other keys' messages are acked.
func TestBatchOrderedFailureHoldsLaterOfKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The value carries the id; the key is the id's letter.
		src := sluicetest.NewSource()
		for _, id := range []string{"a1", "b1", "a2", "a3", "b2"} {
			src.PublishMsg(sluicetest.Msg{ID: id, Key: []byte(id[:1]), Value: []byte(id)})
		}
		type run struct {
			id      string
			attempt int
		}
		var mu sync.Mutex
		var runs [][]run
		calls := 0
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			var rs []run
			for i, m := range b.Messages {
				id := string(m.Value)
				rs = append(rs, run{id, m.Attempt})
				if calls == 1 && id == "a1" {
					b.Fail(i, errors.New("deadlock, retry"))
				}
			}
			runs = append(runs, rs)
			return nil
		})
		r.Ordering = consumer.ByKey
		r.Window.MinFetch = 5
		hook := &settledOrder{}
		c, err := consumer.New(consumer.Options{Hook: hook}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		want := [][]run{
			{{"a1", 1}, {"b1", 1}, {"a2", 1}, {"a3", 1}, {"b2", 1}},
			{{"a1", 2}, {"a2", 1}, {"a3", 1}},
		}
		if fmt.Sprint(runs) != fmt.Sprint(want) {
			t.Fatalf("batches %v, want %v", runs, want)
		}
		hook.mu.Lock()
		order := hook.ids
		hook.mu.Unlock()
		var as []string
		for _, o := range order {
			if strings.HasPrefix(o, "a") {
				as = append(as, o)
			}
		}
		ledger, errs := src.Ledger()
		for id, rec := range ledger {
			if counts(rec) != counts(sluicetest.Record{Deliveries: 1, Acks: 1}) {
				t.Fatalf("%s: %+v (an ordered route retries in place)", id, rec)
			}
		}
		s := c.Stats()[0]
		if len(errs) > 0 || !slices.Equal(as, []string{"a1:succeeded", "a2:succeeded", "a3:succeeded"}) ||
			s.Order.Retries != 1 || s.Settled[consumer.OutcomeSucceeded] != 5 {
			t.Fatalf("errs %v, settlements %v, stats %+v %+v", errs, order, s.Order, s.Settled)
		}
	})
}

// Shutdown hands back the messages of a batch still forming; the handler
// never runs them.
func TestBatchShutdownReturnsForming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 3 {
			src.Publish(fmt.Sprint("m", i), nil, nil, time.Time{})
		}
		ran := false
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			ran = true
			return nil
		})
		r.Batch.Linger = time.Hour
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		ledger, errs := src.Ledger()
		for id, rec := range ledger {
			if counts(rec) != counts(sluicetest.Record{Deliveries: 1, Naks: 1}) {
				t.Fatalf("%s: %+v (ran %v)", id, rec, ran)
			}
		}
		if s := c.Stats()[0]; ran || len(errs) > 0 || s.Settled[consumer.OutcomeReturned] != 3 {
			t.Fatalf("ran %v, errs %v, stats %+v", ran, errs, s.Settled)
		}
	})
}

func TestBatchOptionsValidated(t *testing.T) {
	slots, err := backpressure.NewSlots(1)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *consumer.Batch) error { return nil }
	for name, r := range map[string]consumer.Route{
		"both handlers":   {Name: "r", Source: sluicetest.NewSource(), BatchHandler: h, Handler: func(context.Context, *consumer.Message) error { return nil }},
		"negative linger": {Name: "r", Source: sluicetest.NewSource(), BatchHandler: h, Batch: consumer.BatchPolicy{Linger: -1}},
		"negative max":    {Name: "r", Source: sluicetest.NewSource(), BatchHandler: h, Batch: consumer.BatchPolicy{MaxMessages: -1}},
		"negative bytes":  {Name: "r", Source: sluicetest.NewSource(), BatchHandler: h, Batch: consumer.BatchPolicy{MaxBytes: -1}},
		"slots":           {Name: "r", Source: sluicetest.NewSource(), BatchHandler: h, Overload: consumer.OverloadPolicy{Slots: slots}},
	} {
		if _, err := consumer.New(consumer.Options{}, r); !errors.Is(err, consumer.ErrInvalidOption) {
			t.Errorf("%s: err %v, want ErrInvalidOption", name, err)
		}
	}
	// The minimal batch route needs no numbers.
	if _, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: sluicetest.NewSource(), BatchHandler: h}); err != nil {
		t.Fatal(err)
	}
}

type bctxKey string

// batchHook records batches; it also marks each message's context.
type batchHook struct {
	mu     sync.Mutex
	starts [][]string // per batch, the ids Held's contexts carried
	ends   []consumer.BatchInfo
}

func (h *batchHook) HookRoute(consumer.RouteInfo) consumer.MessageHook { return h }
func (h *batchHook) Held(ctx context.Context, m *consumer.Message, _ consumer.Waits) context.Context {
	return context.WithValue(ctx, bctxKey("id"), string(m.Key))
}
func (h *batchHook) Event(context.Context, *consumer.Message, consumer.Event) {}
func (h *batchHook) BatchStart(ctx context.Context, b *consumer.Batch, msgCtxs []context.Context) context.Context {
	ids := make([]string, len(msgCtxs))
	for i, c := range msgCtxs {
		ids[i], _ = c.Value(bctxKey("id")).(string)
	}
	h.mu.Lock()
	h.starts = append(h.starts, ids)
	h.mu.Unlock()
	return context.WithValue(ctx, bctxKey("batch"), len(h.starts))
}
func (h *batchHook) BatchEnd(ctx context.Context, info consumer.BatchInfo) {
	h.mu.Lock()
	h.ends = append(h.ends, info)
	h.mu.Unlock()
}

// A BatchHook sees each batch start, with its messages' contexts, and end;
// the context BatchStart returns is the handler's; JoinHooks forwards it.
func TestBatchHook(t *testing.T) {
	for _, joined := range []bool{false, true} {
		t.Run(fmt.Sprint("joined=", joined), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := sluicetest.NewSource()
				for i := range 5 {
					src.Publish(fmt.Sprint("m", i), nil, nil, time.Time{})
				}
				var log batchLog
				var seen []any
				r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
					log.add(b)
					seen = append(seen, ctx.Value(bctxKey("batch")))
					return b.Messages[0].InProgress(ctx) // any call; the result is nil
				})
				h := &batchHook{}
				var hook consumer.Hook = h
				if joined {
					hook = consumer.JoinHooks(h, &settledOrder{})
				}
				c, err := consumer.New(consumer.Options{Hook: hook}, r)
				if err != nil {
					t.Fatal(err)
				}
				stop := start(t, c)
				time.Sleep(time.Second)
				synctest.Wait()
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				got := log.get()
				if fmt.Sprint(h.starts) != fmt.Sprint(got) || len(h.ends) != len(got) || len(seen) != len(got) {
					t.Fatalf("starts %v, ends %v, batches %v", h.starts, h.ends, got)
				}
				for i, e := range h.ends {
					if e.Size != len(got[i]) || e.Err != nil || seen[i] != i+1 {
						t.Fatalf("end %d: %+v (handler ctx value %v) for %v", i, e, seen[i], got[i])
					}
				}
			})
		})
	}
}

// ByPartition: a batch carries many messages of one partition (its head
// and the messages behind it), in delivery order, so batches are not
// limited to one message per partition; across batches each partition's
// messages still run in order.
func TestBatchByPartitionKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 60 {
			p := int32(i % 2)
			src.PublishMsg(sluicetest.Msg{ID: fmt.Sprint(i), Key: []byte(fmt.Sprint(i)), Partition: p, Value: []byte(fmt.Sprintf("%d:%02d", p, i))})
		}
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			ids := make([]string, b.Len())
			for i, m := range b.Messages {
				ids[i] = string(m.Value)
			}
			log.mu.Lock()
			log.batches = append(log.batches, ids)
			log.mu.Unlock()
			return nil
		})
		r.Workers = 2
		r.Ordering = consumer.ByPartition
		r.Batch.MaxMessages = 20
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		last := map[byte]string{}
		biggest := 0
		for _, b := range log.get() {
			biggest = max(biggest, len(b))
			for _, v := range b {
				if prev := last[v[0]]; v <= prev {
					t.Fatalf("partition %c: %s ran after %s (batches %v)", v[0], v, prev, log.get())
				}
				last[v[0]] = v
			}
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeSucceeded] != 60 || biggest <= 2 {
			t.Fatalf("succeeded %d, biggest batch %d: want batches beyond one message a partition", s.Settled[consumer.OutcomeSucceeded], biggest)
		}
	})
}

// Random batches under random faults keep the ledger: every message ends
// exactly once for good (acked or terminated, never dropped by a Nak on its
// last delivery), each ordered key's messages succeed in delivery order,
// the stats add up and the window is empty at the end. One seed is one
// reproducible run.
func TestBatchLedgerUnderFaults(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 27))
				src := sluicetest.NewSource()
				src.MaxDeliver = 3
				src.HonorDelay = rng.IntN(2) == 0
				src.Confirm = sluicetest.ConfirmMode(rng.IntN(2)) // at once, or async
				var sink sluicetest.Sink
				srng := rand.New(rand.NewPCG(seed, 7))
				sinkOne := make(chan struct{}, 1)
				sink.FailWith(func(*dlq.Letter) error {
					sinkOne <- struct{}{}
					defer func() { <-sinkOne }()
					if srng.IntN(4) == 0 {
						return errors.New("store down")
					}
					return nil
				})
				const n = 300
				now := time.Now()
				for i := range n {
					var h consumer.Headers
					if rng.IntN(3) == 0 {
						h = consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(now.Add(time.Duration(rng.IntN(400)) * time.Millisecond))}}
					}
					src.PublishMsg(sluicetest.Msg{ID: fmt.Sprint(i), Key: []byte(fmt.Sprint("k", i%7)), Partition: int32(i % 3),
						Value: []byte(fmt.Sprintf("%03d", i)), Headers: h})
				}
				var blog batchLog
				one := make(chan struct{}, 1) // one handler draws at a time (a channel: durable for synctest)
				hrng := rand.New(rand.NewPCG(seed, 99))
				r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
					one <- struct{}{}
					defer func() { <-one }()
					ids := make([]string, b.Len())
					for i, m := range b.Messages {
						ids[i] = fmt.Sprintf("%s/%d", m.Value, m.Attempt)
					}
					blog.mu.Lock()
					blog.batches = append(blog.batches, ids)
					blog.mu.Unlock()
					time.Sleep(time.Duration(1+hrng.IntN(20)) * time.Millisecond)
					switch hrng.IntN(10) {
					case 0:
						return errors.New("batch failed")
					case 1:
						panic("batch panicked")
					}
					for i := range b.Messages {
						switch hrng.IntN(12) {
						case 0:
							b.Fail(i, consumer.Permanent(errors.New("poison")))
						case 1:
							b.Fail(i, errors.New("row failed"))
						case 2:
							b.Fail(i, backpressure.Overloaded(errors.New("busy")))
						}
					}
					return nil
				})
				r.Workers = 1 + rng.IntN(4)
				r.Batch.MaxMessages = 1 + rng.IntN(40)
				r.Batch.Linger = time.Duration(rng.IntN(3)) * 5 * time.Millisecond
				r.Ordering = consumer.Ordering(rng.IntN(3))
				r.Retry.MaxAttempts = 3
				r.DeadLetter.Sink = &sink
				hook := &settledOrder{}
				c, err := consumer.New(consumer.Options{Hook: hook}, r)
				if err != nil {
					t.Fatal(err)
				}
				stop := start(t, c)
				time.Sleep(time.Minute)
				synctest.Wait()
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				ledger, errs := src.Ledger()
				if len(errs) > 0 {
					t.Fatal(errs)
				}
				for id, rec := range ledger {
					if rec.Acks+rec.Terms != 1 || rec.Dropped || rec.Pending {
						t.Fatalf("%s: %+v (workers %d, batch %d, ordering %v)", id, rec, r.Workers, r.Batch.MaxMessages, r.Ordering)
					}
				}
				s := c.Stats()[0]
				var sum uint64
				for _, v := range s.Settled {
					sum += v
				}
				if s.Fetched != sum || s.Held != 0 || s.Window.InUse != 0 || s.Window.InUseBytes != 0 || sluicetest.Final(s) != n {
					t.Fatalf("stats %+v", s)
				}
				if r.Ordering == consumer.Unordered || src.Confirm != sluicetest.ConfirmAtOnce {
					// With async confirmations the hook sees settlements in
					// the order the confirmations come, not the order they
					// were sent in.
					return
				}
				// Acked messages of one key (ByKey) or partition (ByPartition)
				// were acked in delivery order.
				hook.mu.Lock()
				defer hook.mu.Unlock()
				last := map[string]string{}
				for _, e := range hook.ids {
					v, out, _ := strings.Cut(e, ":")
					if out != consumer.OutcomeSucceeded.String() {
						continue
					}
					i, err := strconv.Atoi(v)
					if err != nil {
						t.Fatal(err)
					}
					k := fmt.Sprint("k", i%7)
					if r.Ordering == consumer.ByPartition {
						k = fmt.Sprint("p", i%3)
					}
					if v <= last[k] {
						var trail []string
						for _, e := range hook.ids {
							if strings.HasPrefix(e, v+":") || strings.HasPrefix(e, last[k]+":") {
								trail = append(trail, e)
							}
						}
						var bs []string
						for _, b := range blog.get() {
							bs = append(bs, fmt.Sprint(b))
						}
						t.Fatalf("%s: %s acked after %s (%v, confirm %d): settlements %v; batches %v", k, v, last[k], r.Ordering, src.Confirm, trail, bs)
					}
					last[k] = v
				}
			})
		})
	}
}

// A key's head shed near its deadline when its batch is about to run (an
// ordered route holds it back to run again) keeps its riders back too: they
// run after it is settled, never ahead of it. (The simulation found the
// riders running, and acked, ahead of their shed head.)
func TestBatchShedHeadKeepsRidersBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		soon := consumer.Headers{}
		soon.Set(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(55*time.Millisecond)))
		src.PublishMsg(sluicetest.Msg{ID: "a1", Key: []byte("a"), Value: []byte("a1"), Headers: soon})
		src.PublishMsg(sluicetest.Msg{ID: "b1", Key: []byte("b"), Value: []byte("b1")})
		src.PublishMsg(sluicetest.Msg{ID: "a2", Key: []byte("a"), Value: []byte("a2")})
		src.PublishMsg(sluicetest.Msg{ID: "a3", Key: []byte("a"), Value: []byte("a3")})
		var log batchLog
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			ids := make([]string, b.Len())
			for i, m := range b.Messages {
				ids[i] = string(m.Value)
			}
			log.mu.Lock()
			log.batches = append(log.batches, ids)
			log.mu.Unlock()
			return nil
		})
		r.Ordering = consumer.ByKey
		r.Window.MinFetch = 4
		// At the batch's start (after the 10 ms linger) a1 has 45 ms left.
		r.Overload.ShedNearDeadline = 50 * time.Millisecond
		r.Overload.ShedDelay = 100 * time.Millisecond
		hook := &settledOrder{}
		c, err := consumer.New(consumer.Options{Hook: hook}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		hook.mu.Lock()
		order := slices.Clone(hook.ids)
		hook.mu.Unlock()
		var as []string
		for _, o := range order {
			if strings.HasPrefix(o, "a") {
				as = append(as, o)
			}
		}
		want := []string{"a1:expired", "a2:succeeded", "a3:succeeded"}
		if !slices.Equal(as, want) {
			t.Fatalf("key a settled %v, want %v (batches %v)", as, want, log.get())
		}
		if bs := log.get(); len(bs) == 0 || !slices.Equal(bs[0], []string{"b1"}) {
			t.Fatalf("batches %v: the first should hold b1 alone", bs)
		}
	})
}

// dupSource hands over, in one fetch, two deliveries of one message (same
// Origin: the broker redelivered it while the first was held) and another
// message; an Acker that acks at once.
type dupSource struct {
	once sync.Once
}

type nopAcker struct{}

func (nopAcker) Settle(context.Context, consumer.Settlement) error { return nil }
func (nopAcker) InProgress(context.Context) error                  { return nil }

func (s *dupSource) Attach(consumer.RouteLimits) (consumer.SourceInfo, error) {
	return consumer.SourceInfo{}, nil
}

func (s *dupSource) Fetch(ctx context.Context, _ int, _ int64) ([]*consumer.Message, error) {
	var out []*consumer.Message
	s.once.Do(func() {
		for i, off := range []int64{7, 7, 8} {
			m := consumer.NewMessage(nopAcker{})
			m.Topic = "t"
			m.Value = []byte(fmt.Sprint("d", i, "-off", off))
			m.Size = 10
			m.Origin = dlq.Origin{Topic: "t", Offset: off}
			out = append(out, m)
		}
	})
	if out != nil {
		return out, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A batch never holds two deliveries of one message (the same Origin): the
// second waits for a later batch, so a bulk write never touches one row
// twice in one statement. (The simulation found both deliveries of a
// message running in one batch, at once.)
func TestBatchRedeliveryWaitsForNextBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log batchLog
		r := batchRoute("r", &dupSource{}, func(ctx context.Context, b *consumer.Batch) error {
			ids := make([]string, b.Len())
			for i, m := range b.Messages {
				ids[i] = string(m.Value)
			}
			log.mu.Lock()
			log.batches = append(log.batches, ids)
			log.mu.Unlock()
			return nil
		})
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		// The second delivery cuts the first batch; it runs in the next.
		got := fmt.Sprint(log.get())
		want := "[[d0-off7] [d1-off7 d2-off8]]"
		if got != want {
			t.Fatalf("batches %s, want %s", got, want)
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeSucceeded] != 3 {
			t.Fatalf("settled %v", s.Settled)
		}
	})
}

// A message whose dead-letter write takes long in the checks before its
// batch runs does not make the others run unchecked after it: a message
// whose deadline passed meanwhile is expired, not run. (The simulation
// found a batch run after a hung write, past its messages' deadlines and
// after the shutdown had abandoned them.)
func TestBatchChecksAgainAfterSlowLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		dl := func(d time.Duration) consumer.Headers {
			h := consumer.Headers{}
			h.Set(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(d)))
			return h
		}
		// x expires during the 10 ms linger; y 200 ms later.
		src.PublishMsg(sluicetest.Msg{ID: "x", Value: []byte("x"), Headers: dl(5 * time.Millisecond)})
		src.PublishMsg(sluicetest.Msg{ID: "y", Value: []byte("y"), Headers: dl(200 * time.Millisecond)})
		var ran []string
		var mu sync.Mutex
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range b.Messages {
				ran = append(ran, string(m.Value))
			}
			return nil
		})
		r.Window.MinFetch = 2
		r.DeadLetter.OnExpired = consumer.ExpiredDeadLetter
		r.DeadLetter.Sink = dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
			time.Sleep(500 * time.Millisecond) // a slow store
			return nil
		})
		hook := &settledOrder{}
		c, err := consumer.New(consumer.Options{Hook: hook}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		hook.mu.Lock()
		defer hook.mu.Unlock()
		if len(ran) != 0 || hook.out["x"] != consumer.OutcomeExpired || hook.out["y"] != consumer.OutcomeExpired {
			t.Fatalf("ran %v, outcomes %v: both should expire, neither run", ran, hook.out)
		}
	})
}

// A slow dead-letter write for a message found unable to make its deadline
// while a batch forms holds up the worker that found it, not the other
// workers' batches: the forming token is given back before the write.
func TestBatchLateLetterDoesNotStallOtherWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		begin := time.Now()
		var mu sync.Mutex
		started := map[string]time.Duration{}
		r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
			for _, m := range b.Messages {
				mu.Lock()
				started[string(m.Value)] = time.Since(begin)
				mu.Unlock()
				if string(m.Value) == "warm" {
					time.Sleep(100 * time.Millisecond) // the route learns batches take 100 ms
				}
			}
			return nil
		})
		r.Workers = 2
		r.Batch = consumer.BatchPolicy{MaxMessages: 1}
		r.DeadLetter.OnExpired = consumer.ExpiredDeadLetter
		r.DeadLetter.Sink = dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
			time.Sleep(time.Second) // a slow store
			return nil
		})
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		src.Publish("warm", []byte("warm"), nil, time.Time{})
		time.Sleep(200 * time.Millisecond)
		// x cannot finish in its 50 ms: it is found late when a batch forms.
		src.PublishMsg(sluicetest.Msg{ID: "x", Value: []byte("x"), Headers: deadlineIn(50 * time.Millisecond)})
		src.Publish("y", []byte("y"), nil, time.Time{})
		src.Publish("z", []byte("z"), nil, time.Time{})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		s := c.Stats()[0]
		if _, ran := started["x"]; ran || s.Settled[consumer.OutcomeExpired] != 1 {
			t.Fatalf("x ran or was not expired: %v, settled %v", started, s.Settled)
		}
		// One of y and z waits for the write on the worker that found x;
		// the other runs at once on the other worker.
		first := min(started["y"], started["z"])
		if first > 300*time.Millisecond || started["y"] == 0 || started["z"] == 0 {
			t.Fatalf("y and z started at %v and %v: the slow letter held up both workers", started["y"], started["z"])
		}
	})
}
