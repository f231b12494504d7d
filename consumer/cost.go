package consumer

import (
	"strconv"
	"sync"
	"time"
)

// classCosts learns each message class's handler time (CostPolicy.Class):
// an exponentially weighted mean per class key, weight 1/8 per run, for at
// most maxClasses keys (beyond that the table starts over: bounded memory
// beats a long memory).
type classCosts struct {
	mu sync.Mutex
	m  map[string]time.Duration
}

const maxClasses = 1024

func (c *classCosts) observe(class string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxClasses {
		if _, ok := c.m[class]; !ok {
			c.m = make(map[string]time.Duration)
		}
	}
	if old, ok := c.m[class]; ok {
		c.m[class] = old + (d-old)/8
	} else {
		c.m[class] = d
	}
}

func (c *classCosts) mean(class string) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[class]
	return d, ok
}

// unitsOf sets and returns what m costs against the window and queue: one
// unit without Window.Cost; else the first positive of the route's cost
// function, the cost header and the cost learned for m's class, at most
// CostPolicy.Max (or a quarter of the window), at least one. It never
// exceeds the window's limit in force, so a dear message always fits an
// empty window.
func (r *route) unitsOf(m *Message) int {
	cp := &r.cfg.Window.Cost
	u := 1
	if cp.Enabled() {
		u = 0
		if cp.Func != nil {
			u = cp.Func(m)
		}
		if u <= 0 && cp.Header != "" {
			if v, ok := m.Headers.Lookup(cp.Header); ok {
				if n, err := strconv.Atoi(v); err == nil {
					u = n
				}
			}
		}
		if cp.Class != nil {
			m.costClass = cp.Class(m)
			if u <= 0 {
				if d, ok := r.costs.mean(m.costClass); ok {
					unit := cp.Unit
					if unit <= 0 {
						unit = time.Millisecond
					}
					u = int((d + unit - 1) / unit)
				}
			}
		}
		maxU := cp.Max
		if maxU <= 0 {
			maxU = max(1, r.cfg.Window.Messages/4)
		}
		u = min(max(u, 1), maxU)
	}
	u = min(u, r.window.Limit())
	m.units = int32(u)
	return u
}
