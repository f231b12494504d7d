package consumer

import (
	"context"
	"time"
)

// keepAliveLoop sends InProgress for every message the route holds and has
// not touched for a KeepAlive interval: queued, running, waiting for the
// window, or waiting for a dead-letter write. Messages whose settlement was
// sent are left alone.
func (r *route) keepAliveLoop(ctx context.Context) {
	t := time.NewTicker(r.keepAlive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cut := now.Add(-r.keepAlive).UnixNano()
			for _, m := range r.held.snapshot() {
				if m.touched.Load() > cut || msgState(m.state.Load()) > stateClaimed {
					continue
				}
				if err := m.InProgress(ctx); err != nil {
					r.c.settleErrors.Add(1)
					r.noteError("keep-alive", err)
				} else {
					r.c.keepAlives.Add(1)
				}
			}
		}
	}
}
