package consumer_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// A route ordered ByKey runs different accounts in parallel on its four
// workers and each account's events one at a time, in order.
func ExampleOrdering() {
	src := sluicetest.NewSource()
	for i, account := range []string{"alice", "bob", "alice", "bob", "alice"} {
		src.PublishMsg(sluicetest.Msg{ID: strconv.Itoa(i), Key: []byte(account), Value: []byte(strconv.Itoa(i))})
	}
	var mu sync.Mutex
	applied := map[string][]string{}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "accounts", Source: src, Workers: 4, Ordering: consumer.ByKey,
		Handler: func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			defer mu.Unlock()
			applied[string(m.Key)] = append(applied[string(m.Key)], string(m.Value))
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = sluicetest.RunUntil(context.Background(), c, 5*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == 5
	})
	fmt.Println("alice:", applied["alice"], "bob:", applied["bob"], err)
	// Output: alice: [0 2 4] bob: [1 3] <nil>
}
