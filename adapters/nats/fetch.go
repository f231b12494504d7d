package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/consumer"
)

// subscription returns the channel pull replies arrive on, subscribing on
// first use. The channel holds what one pull request can bring plus what a
// given-up request may still deliver, so it is sized from the window (a
// nats.go SubscribeSync would allocate 65,536 slots, 512 KiB, per route).
func (s *Source) subscription(n int) (chan *nats.Msg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, consumer.ErrClosed
	}
	if s.sub == nil || !s.sub.IsValid() {
		w := s.window
		if w <= 0 {
			w = n
		}
		ch := make(chan *nats.Msg, pullChanCap(w))
		inbox := s.nc.NewInbox()
		sub, err := s.nc.ChanSubscribe(inbox+".*", ch)
		if err != nil {
			if errors.Is(err, nats.ErrConnectionClosed) {
				return nil, fmt.Errorf("natsadapter: %w: %w", consumer.ErrClosed, err)
			}
			return nil, err
		}
		s.sub, s.ch, s.inbox = sub, ch, inbox
		s.req = openRequest{}
	}
	return s.ch, nil
}

// pullChanCap is the reply channel's size for a window of w messages: one
// request's deliveries, the late deliveries of a request given up with a
// connection (at most as many again), and status messages.
func pullChanCap(w int) int { return 2*w + 8 }

// openRequest is the pull request still being served: what the server may
// still deliver for it. At most one is open; it was sized from free window
// capacity that stays free until its messages arrive, so the route's window
// always covers held messages plus what is still on its way.
type openRequest struct {
	reply    string
	msgs     int
	bytes    int64 // as the server counts them; 0: no byte limit
	limited  bool
	deadline time.Time // when to give up on it (connection lost)
}

// Fetch returns deliveries of one pull request for up to maxMessages
// messages totalling at most maxBytes. It sends the request, waits for the
// first delivery (at most PollWait), and returns what has arrived by then;
// the rest of the same request streams into the next Fetch calls, which
// send a new request only once it is over. When the next message alone is
// larger than maxBytes (the server answers 409 Message Size Exceeds
// MaxBytes before delivering anything), it pulls that one message without a
// byte limit and returns it alone.
func (s *Source) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxMessages <= 0 {
		return nil, nil
	}
	if s.rec != nil && s.MaxDeliver() > 0 {
		if err := s.rec.start(ctx); err != nil {
			return nil, err
		}
	}
	msgs, tooBig, err := s.pull(ctx, maxMessages, maxBytes)
	if tooBig && len(msgs) == 0 && err == nil {
		msgs, _, err = s.pull(ctx, 1, 0)
	}
	switch {
	case err == nil:
		s.pullErr.Store(nil)
	case ctx.Err() == nil:
		s.pullErr.Store(&err)
	}
	return msgs, err
}

func (s *Source) send(ctx context.Context, n int, maxBytes int64) error {
	s.sizeAckPending(ctx)
	s.refreshAckFloor(ctx)
	s.seq++
	reply := s.inbox + "." + strconv.FormatUint(s.seq, 36)
	// Encoded by hand: it is three numbers, on every pull.
	req := make([]byte, 0, 96)
	req = append(req, `{"batch":`...)
	req = strconv.AppendInt(req, int64(n), 10)
	if maxBytes > 0 {
		req = append(req, `,"max_bytes":`...)
		req = strconv.AppendInt(req, maxBytes, 10)
	}
	req = append(req, `,"expires":`...)
	req = strconv.AppendInt(req, int64(s.opts.PollWait), 10)
	req = append(req, `,"no_wait":true}`...)
	if err := s.nc.PublishRequest(s.next, reply, req); err != nil {
		return s.connErr(err)
	}
	s.req = openRequest{reply: reply, msgs: n, bytes: maxBytes, limited: maxBytes > 0,
		deadline: time.Now().Add(s.opts.PollWait + s.opts.PollWait/2)}
	return nil
}

// isStatus reports whether m is a status the server sent for a pull
// request (no messages, timeout, heartbeat, an error). A delivery always
// carries its JetStream ack subject as reply; a status never has a reply,
// so a user message with a header named Status and no payload is still a
// delivery.
func isStatus(m *nats.Msg) bool {
	return m.Reply == "" && len(m.Data) == 0 && m.Header.Get("Status") != ""
}

// wait returns the next message on ch, or an error when ctx ends
// (ctx.Err()) or the open request's deadline passes
// (context.DeadlineExceeded).
func (s *Source) wait(ctx context.Context, ch chan *nats.Msg) (*nats.Msg, error) {
	select {
	case m := <-ch:
		return m, nil
	default:
	}
	d := time.Until(s.req.deadline)
	if d <= 0 {
		return nil, context.DeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case m := <-ch:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, context.DeadlineExceeded
	}
}

func (s *Source) pull(ctx context.Context, n int, maxBytes int64) (out []*consumer.Message, tooBig bool, err error) {
	ch, err := s.subscription(n)
	if err != nil {
		return nil, false, err
	}
	if s.req.msgs == 0 {
		// Never ask for more than the reply channel can take.
		n = min(n, cap(ch)-len(ch)-1)
		if n <= 0 {
			n = 1
		}
		if err := s.send(ctx, n, maxBytes); err != nil {
			return nil, false, err
		}
	}
	// The open request was sized from capacity that is still free, so it
	// never brings more than asked now; cap anyway.
	n = min(n, s.req.msgs)
	for len(out) < n {
		var m *nats.Msg
		if len(out) > 0 {
			// Hand over what has arrived; the rest of this request comes
			// with the next call, while the workers are busy.
			select {
			case m = <-ch:
			default:
				return out, false, nil
			}
		} else if m, err = s.wait(ctx, ch); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				// Shutting down: take what already arrived, so the
				// consumer hands it back now rather than after AckWait.
				for len(out) < n {
					select {
					case m := <-ch:
						if !isStatus(m) {
							if cm := s.take(m); cm != nil {
								out = append(out, cm)
							}
						}
						continue
					default:
					}
					break
				}
				s.req = openRequest{}
				return out, false, cerr
			}
			s.req = openRequest{}
			if s.subGone() {
				return out, false, s.connErr(nats.ErrBadSubscription)
			}
			return out, false, nil // the request was lost with a connection
		}
		if isStatus(m) {
			if m.Subject != s.req.reply {
				continue // the end of an earlier request that was given up
			}
			st, desc := m.Header.Get("Status"), m.Header.Get("Description")
			switch st {
			case "100": // idle heartbeat
				continue
			case "404", "408": // nothing (more) now; expired
				s.req = openRequest{}
				return out, false, nil
			case "409":
				s.req = openRequest{}
				if desc == "Message Size Exceeds MaxBytes" {
					return out, len(out) == 0, nil
				}
				if desc == "Consumer Deleted" {
					return out, false, s.consumerGone(ctx, st, desc)
				}
				return out, false, fmt.Errorf("%w: 409 %s", ErrPull, desc)
			case "503": // no responders: no consumer to serve the pull
				s.req = openRequest{}
				return out, false, s.consumerGone(ctx, st, "No Responders")
			default:
				s.req = openRequest{}
				return out, false, fmt.Errorf("%w: %s %s", ErrPull, st, desc)
			}
		}
		// Deliveries carry the stream subject, not the reply: a late one
		// for an earlier, given-up request (its connection dropped) is
		// taken as part of this one. It was asked for by this route's
		// window too, so it is at most one batch over, and the consumer
		// charges it like any other.
		if cm := s.take(m); cm != nil {
			out = append(out, cm)
		}
		s.delivered++
		s.req.msgs--
		if s.req.limited {
			// At exactly maxBytes the server ends the request without a
			// status; count the way it does (subject, reply, header, data).
			s.req.bytes -= int64(len(m.Subject)+len(m.Reply)+len(m.Data)) + headerLen(m.Header)
			if s.req.bytes <= 0 {
				s.req = openRequest{}
			}
		}
		if s.req.msgs <= 0 {
			s.req = openRequest{}
			return out, false, nil
		}
	}
	return out, false, nil
}

// returnUnread naks, without delay and in the order they came, the
// deliveries of the open pull request that no Fetch returned: the rest of a
// request the route stopped reading when it shut down (waiting for it up to
// the request's deadline). Left alone they would come back only after
// AckWait, after the messages the next consumer reads first, so a keyed
// route would see a key's earlier messages after its later ones; nak'd,
// JetStream redelivers them before anything new, behind what the route
// handed back itself.
func (s *Source) returnUnread() {
	s.mu.Lock()
	ch, ok := s.ch, s.sub != nil && !s.closed
	s.mu.Unlock()
	if !ok {
		return
	}
	naked := false
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		default:
			d := time.Until(s.req.deadline)
			if s.req.msgs <= 0 || d <= 0 {
				if naked {
					_ = s.nc.FlushTimeout(time.Second)
				}
				return
			}
			t := time.NewTimer(d)
			select {
			case m = <-ch:
				t.Stop()
			case <-t.C:
				continue
			}
		}
		if isStatus(m) {
			if m.Subject == s.req.reply && m.Header.Get("Status") != "100" {
				s.req = openRequest{} // the request is over
			}
			continue
		}
		s.req.msgs--
		if m.Nak() == nil {
			naked = true
			s.c.returnedUnread.Add(1)
		}
	}
}

func (s *Source) subGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sub == nil || !s.sub.IsValid()
}

// headerLen is the wire length of h as nats.go encodes it.
func headerLen(h nats.Header) int64 {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return int64(n)
}

func (s *Source) connErr(err error) error {
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed || s.nc.IsClosed() {
			return fmt.Errorf("natsadapter: %w: %w", consumer.ErrClosed, err)
		}
	}
	return fmt.Errorf("natsadapter: pull: %w", err)
}

// ackFloorEvery is how often a Source that owns its consumer reads the
// consumer's ack floor, the position it recreates the consumer from if it
// is deleted: after a second with deliveries, or after ackFloorMsgs
// deliveries, whichever comes first. One consumer info request per 1,024
// messages or per second costs little; a recreation then delivers again
// about that much.
const (
	ackFloorEvery = time.Second
	ackFloorMsgs  = 1024
)

// refreshAckFloor reads the consumer's ack floor when the Source owns the
// consumer and enough was delivered since the last read. A failed read
// keeps the older floor (a recreation then starts earlier: duplicates,
// never a gap).
func (s *Source) refreshAckFloor(ctx context.Context) {
	if s.owned == nil || s.delivered == 0 || s.delivered < ackFloorMsgs && time.Since(s.infoAt) < ackFloorEvery {
		return
	}
	s.infoAt = time.Now()
	ictx, cancel := context.WithTimeout(ctx, s.opts.PollWait)
	defer cancel()
	info, err := s.Consumer().Info(ictx)
	if err != nil {
		return
	}
	s.delivered = 0
	s.ackFloor = info.AckFloor.Stream
}

// consumerGone handles a pull refused because no consumer served it. It
// checks that the consumer is really gone (a 503 also happens while
// JetStream restarts), then recreates it if the Source owns it, or fails
// the route with a clear error.
func (s *Source) consumerGone(ctx context.Context, status, desc string) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.PollWait+time.Second)
	defer cancel()
	_, err := s.js.Consumer(cctx, s.stream, s.name)
	switch {
	case err == nil:
		return fmt.Errorf("%w: %s %s (the consumer exists)", ErrPull, status, desc)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("natsadapter: consumer %q: stream %q is gone: %w: %w", s.name, s.stream, jetstream.ErrStreamNotFound, consumer.ErrClosed)
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("%w: %s %s (checking the consumer: %v)", ErrPull, status, desc, err)
	}
	if s.owned == nil {
		return fmt.Errorf("natsadapter: consumer %q on stream %q (created outside sluice, so not recreated): %w: %w",
			s.name, s.stream, ErrConsumerDeleted, consumer.ErrClosed)
	}
	cfg := *s.owned
	if s.autoAckPending {
		cfg.MaxAckPending = s.window + s.reserve
	}
	start := "its configured start"
	if s.ackFloor > 0 {
		// Deliver again everything above the last ack floor seen: what was
		// acknowledged since comes again (duplicates), nothing is skipped.
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = s.ackFloor + 1
		cfg.OptStartTime = nil
		start = "stream sequence " + strconv.FormatUint(cfg.OptStartSeq, 10)
	}
	cons, err := s.js.CreateOrUpdateConsumer(cctx, s.stream, cfg)
	if err != nil {
		// Another process sharing the durable may have recreated it first.
		var gerr error
		if cons, gerr = s.js.Consumer(cctx, s.stream, s.name); gerr != nil {
			return fmt.Errorf("natsadapter: consumer %q on stream %q: %w; recreating it failed: %w", s.name, s.stream, ErrConsumerDeleted, err)
		}
		start = "where the consumer another process recreated starts"
	}
	s.mu.Lock()
	s.cons = cons
	s.mu.Unlock()
	s.gen.Add(1)
	s.set.failOlder(s.gen.Load())
	s.c.recreated.Add(1)
	return fmt.Errorf("natsadapter: consumer %q on stream %q: %w; recreated, delivering from %s", s.name, s.stream, ErrConsumerDeleted, start)
}
