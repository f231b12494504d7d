package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-go/sluice/consumer"
)

// order is one message's payload.
type order struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

const schema = `CREATE TABLE IF NOT EXISTS orders (
	id           text PRIMARY KEY,
	customer     text NOT NULL,
	amount_cents bigint NOT NULL,
	deadline     timestamptz,
	written_at   timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// store writes orders into PostgreSQL. The table's primary key makes every
// write idempotent: a redelivered order (at-least-once) is skipped by ON
// CONFLICT DO NOTHING, whether it comes alone or in a batch.
type store struct {
	pool *pgxpool.Pool
}

// openStore creates the orders table if needed and a pool of conns
// connections, each with its own staging table for batches.
func openStore(ctx context.Context, dsn string, conns int) (*store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		// Per connection, emptied by every commit: COPY goes here first,
		// then one INSERT … SELECT moves the rows, skipping duplicates.
		_, err := c.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS orders_stage
			(id text, customer text, amount_cents bigint, deadline timestamptz) ON COMMIT DELETE ROWS`)
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, schema)
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &store{pool: pool}, nil
}

func (s *store) Close() { s.pool.Close() }

// Reset empties the table.
func (s *store) Reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE orders`)
	return err
}

// Count returns how many orders are stored.
func (s *store) Count(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	return n, err
}

// CountIDs returns how many of ids are stored.
func (s *store) CountIDs(ctx context.Context, ids []string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = ANY($1)`, ids).Scan(&n)
	return n, err
}

// WrittenLate returns how many orders were written after their deadline.
func (s *store) WrittenLate(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE written_at > deadline`).Scan(&n)
	return n, err
}

// decode reads an order; what cannot be read never will be: Permanent.
func decode(m *consumer.Message) (order, error) {
	var o order
	if err := json.Unmarshal(m.Value, &o); err != nil {
		return o, consumer.Permanent(fmt.Errorf("decode order: %w", err))
	}
	if o.ID == "" || o.AmountCents < 0 {
		return o, consumer.Permanent(errors.New("order without id or with a negative amount"))
	}
	return o, nil
}

func deadlineOf(m *consumer.Message) any {
	if d, ok := m.Deadline(); ok {
		return d
	}
	return nil
}

// InsertBatch is the batch route's handler: one COPY into the staging
// table and one INSERT … ON CONFLICT DO NOTHING for the whole batch, in
// one transaction. An order that cannot be decoded is marked permanent
// (dead-lettered alone); the others are acked once the commit returned.
// ctx ends at the batch's earliest deadline: past it, pgx cancels the
// statement and the transaction rolls back, so no row is written for a
// message settled as expired.
func (s *store) InsertBatch(ctx context.Context, b *consumer.Batch) error {
	rows := make([][]any, 0, b.Len())
	for i, m := range b.Messages {
		o, err := decode(m)
		if err != nil {
			b.Fail(i, err)
			continue
		}
		rows = append(rows, []any{o.ID, o.Customer, o.AmountCents, deadlineOf(m)})
	}
	if len(rows) == 0 {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"orders_stage"}, []string{"id", "customer", "amount_cents", "deadline"}, pgx.CopyFromRows(rows)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, amount_cents, deadline)
		SELECT id, customer, amount_cents, deadline FROM orders_stage ON CONFLICT (id) DO NOTHING`); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // past the deadline: roll back, write nothing
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		// The same, when the ctx's timer has not fired yet (a busy
		// machine runs it late).
		return context.DeadlineExceeded
	}
	// The COMMIT is not cancelled by the deadline: a commit cut short on
	// the client may still have happened on the server, and its messages
	// would then be settled as expired with their rows written. Let it
	// finish: at worst a late success (RouteStats.Late), never a row for
	// a message settled as expired.
	return tx.Commit(context.WithoutCancel(ctx))
}

// InsertOne is the per-message route's handler: one INSERT (and one
// commit) per order.
func (s *store) InsertOne(ctx context.Context, m *consumer.Message) error {
	o, err := decode(m)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO orders (id, customer, amount_cents, deadline) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, o.ID, o.Customer, o.AmountCents, deadlineOf(m))
	return err
}

// payload is a message to load into the broker.
type payload struct {
	ID       string
	Value    []byte
	Deadline time.Time // zero: none
}

// orders returns n orders, every poisonEvery-th (0: none) one not valid
// JSON; ids are prefix-0, prefix-1, ….
func orders(prefix string, n, poisonEvery int) []payload {
	out := make([]payload, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		v, _ := json.Marshal(order{ID: id, Customer: fmt.Sprintf("c%d", i%97), AmountCents: int64(100 + i%5000)})
		if poisonEvery > 0 && i%poisonEvery == poisonEvery-1 {
			v = []byte(`{"id": "` + id + `", "amount_cents": ` + "oops}")
		}
		out[i] = payload{ID: id, Value: v}
	}
	return out
}
