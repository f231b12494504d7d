// Package backpressure holds sluice's admission primitives: the Window that
// bounds one route's in-flight work by message count and by bytes, the
// process-wide Budget that sits above route windows, and the Criticality
// classes used to decide what is shed first.
//
// The model is a lifecycle budget, not a worker limit. Capacity is taken
// before a message is fetched from the broker (the fetch asks only for what is
// free) and given back exactly once, when the message is settled: acked after
// success, dead-lettered, expired, shed, or returned on shutdown. A caller that
// merely stops waiting for a result does not give capacity back, because the
// work it started is still running and still holds memory.
//
// A Window never waits for something that cannot happen: a request for more
// messages than the whole window refuses at once with ErrTooLarge, and a
// single message larger than the whole byte budget is admitted alone, when the
// window is otherwise empty, so an oversized message is a slow path rather
// than a deadlock.
//
// # Overload control
//
// Beyond the static window, the package holds the policies of Google SRE's
// "Handling Overload", each usable alone or through consumer.Route:
//
//   - Criticality travels with the work: WithCriticality / CriticalityFrom
//     put it on a ctx (the consumer does so for every handler, without a
//     per-message allocation) and HeaderValue / CriticalityHeader carry it
//     to the next service, which may lower it but never raise it above its
//     route's class.
//   - Slots shares a scarce capacity (one downstream) among routes by
//     class: the highest waiting class is served first, and lower classes
//     leave headroom, so sheddable routes stop before critical ones lose a
//     slot. Budget does the same for memory.
//   - RetryBudget caps retries at a share of first attempts over a sliding
//     window (10%); Retrier retries a downstream call within an attempt cap
//     and a budget, and gives up "overloaded, do not retry" (ErrOverloaded)
//     so nested layers do not multiply attempts (3, not 3×3×3).
//   - Throttle is client-side adaptive throttling: it rejects locally with
//     probability max(0, (requests − K·accepts)/(requests+1)) over a 2-minute
//     window, which never reaches 1 and decays by itself when the downstream
//     recovers.
//   - AdaptiveLimit is an AIMD concurrency limit driven by latency and
//     errors, with bounds and hysteresis; Window.SetLimit applies it.
//   - PressureFrom tells a handler how pressed its route is (normal,
//     elevated, high) and why, so it can serve a cheaper answer rather
//     than none (degraded mode); a PressureGauge derives the level from a
//     route's window saturation, queue wait against deadline slack, drop
//     rate and throttle, with hysteresis.
//
// Recovery is gradual by construction: AdaptiveLimit grows by Increase per
// interval (and waits Cooldown intervals after a cut: give low-criticality
// routes a longer one), Throttle's probability decays over its window, and
// Slots serve the higher classes first, so low-criticality routes resume
// last. Every time-dependent decision has an At twin that takes the time.
package backpressure
