// Package storytest is otelsluice's traced story as a test harness: a
// message produced inside a span fails twice, is dead-lettered, replayed and
// succeeds, and Run checks that the spans make one connected trace. The
// in-memory run lives with otelsluice's own tests; the runs on the embedded
// NATS server and on kfake live in the test-only module otelsluice/brokerstory,
// so that a user of otelsluice does not get nats-server and kfake in their
// module graph.
package storytest
